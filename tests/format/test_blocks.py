"""Block checksums: one pass gives the file's crc32c and each item's block crcs, and records without them parse."""

from __future__ import annotations

import json
import os

import crc32c
import pytest

from ckptio.errors import CorruptCheckpointError
from ckptio.format.blocks import BLOCK_SIZE, RunningChecksum, crc32c_combine, split_blocks
from ckptio.format.records import FileRecord, ItemRecord, RankIndex


@pytest.mark.parametrize("len1,len2", [(0, 10), (10, 0), (1, 1), (1000, 4 << 20), (3 << 20, 5 << 20), (7, 65537)])
def test_combine_equals_the_crc_of_the_concatenation(len1, len2):
    a, b = os.urandom(len1), os.urandom(len2)
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len2) == crc32c.crc32c(a + b)


def test_running_checksum_is_the_file_crc_and_blocks_are_each_blocks_crc():
    head, body, tail = os.urandom(704), os.urandom(3 * (1 << 20) + 123), os.urandom(900)
    running = RunningChecksum()
    running.add(b"object-bytes")
    crcs = running.add_item([head, body, tail], len(head), len(body), block_size=1 << 20)
    assert running.value == crc32c.crc32c(b"object-bytes" + head + body + tail)
    assert running.size == 12 + len(head) + len(body) + len(tail)
    blocks = split_blocks(5000, len(body), 1 << 20, crcs, "w")
    assert [b.length for b in blocks] == [1 << 20] * 3 + [123]
    assert [b.offset for b in blocks] == [5000 + i * (1 << 20) for i in range(4)]
    for i, block in enumerate(blocks):
        assert int(block.crc, 16) == crc32c.crc32c(body[i << 20 : (i + 1) << 20])


def test_checked_bytes_inside_one_blob_and_split_across_parts():
    blob = os.urandom(10_000)
    for parts in ([blob], [blob[:5000], blob[5000:]]):  # the second: a range across two parts (joined)
        running = RunningChecksum()
        crcs = running.add_item(parts, 4000, 2000, block_size=1500)
        assert running.value == crc32c.crc32c(blob)
        assert crcs == "".join(f"{crc32c.crc32c(blob[s : min(s + 1500, 6000)]):08x}" for s in range(4000, 6000, 1500))


def _index(items: list[dict]) -> bytes:
    return json.dumps({"format": "ckptio-rank-index/1", "step": 1, "rank": 0, "world_size": 1, "save_id": 7,
                       "files": [{"name": "__0_0-x.distcp", "size": 9000, "crc32c": "00000000", "key": ""}],
                       "items": items}).encode()


OLD_ITEM = {"fqn": "w", "offset": [0], "index_hint": 0, "file": "__0_0-x.distcp", "file_offset": 0, "length": 9000}


def test_records_written_before_block_checksums_parse_with_defaults():
    index = RankIndex.from_json(_index([OLD_ITEM]))
    (item,) = index.items
    assert (item.data_offset, item.block_size, item.crc32c) == (None, 0, "")
    assert not item.has_blocks()
    assert FileRecord(name="a", size=1, crc32c="0") is not None


@pytest.mark.parametrize("bad", [
    {"data_offset": 9000, "data_length": 1, "block_size": BLOCK_SIZE, "crc32c": "00000000"},  # past the item
    {"data_offset": 704, "data_length": 8000, "block_size": BLOCK_SIZE, "crc32c": "0000"},  # wrong crc count
    {"data_offset": 704, "data_length": 8000, "block_size": BLOCK_SIZE, "crc32c": "zzzzzzzz"},  # not hex
    {"data_offset": "704", "data_length": 8000, "block_size": BLOCK_SIZE, "crc32c": "00000000"},
    {"data_offset": None, "data_length": 0, "block_size": -1, "crc32c": ""},
])
def test_malformed_block_records_are_corrupt(bad):
    with pytest.raises(CorruptCheckpointError, match="malformed item record 'w'"):
        RankIndex.from_json(_index([{**OLD_ITEM, **bad}]))


def test_item_record_round_trips():
    item = ItemRecord(fqn="w", offset=[0], index_hint=0, file="__0_0-x.distcp", file_offset=0, length=9000,
                      data_offset=704, data_length=8000, block_size=BLOCK_SIZE, crc32c="0123abcd")
    index = RankIndex.from_json(_index([{**OLD_ITEM, **{k: getattr(item, k) for k in (
        "data_offset", "data_length", "block_size", "crc32c")}}]))
    assert index.items == [item]
    assert item.checked_span() == (704, 8000)
