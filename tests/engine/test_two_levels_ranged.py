"""Two levels with ranged reads: a flipped byte inside a tensor of a node's own copy fails that range's block check,
and the range comes from the next source (the partner node's copy) — the restore stays on the local level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptio.format import committed_steps, index_key, read_manifest
from ckptio.format.local_level_records import local_records, own_copy_key
from ckptio.storage import open_storage
from tests.engine.test_two_levels import NODES2, Job

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def test_a_corrupt_range_of_the_own_copy_is_read_from_the_partner_copy(tmp_path: Path) -> None:
    first = Job(tmp_path, NODES2, "exit", steps=5)
    for r in range(2):
        assert first.line(r, "done")["done"] == 5
    assert first.wait() == [0, 0]
    root = open_storage(str(tmp_path / "root"))
    read_manifest(local_records(root), 5)
    assert 5 not in committed_steps(root)  # step 5 is on the local level only
    index = json.loads(local_records(root).get(index_key(5, 0)))
    (item,) = [i for i in index["items"] if i["fqn"] == "w0"]
    own = tmp_path / "local-n0" / own_copy_key(5, item["file"])
    data = bytearray(own.read_bytes())
    data[item["file_offset"] + item["data_offset"] + 1000] ^= 0xFF  # inside w0's bytes
    own.write_bytes(bytes(data))

    again = Job(tmp_path, NODES2, "exit")
    lines = [again.line(r, "restored") for r in range(2)]
    assert again.wait() == [0, 0]
    for line in lines:
        assert line["restored"] == 5 and line["ok"] and line["last_restore"]["level"] == "local", line
    # Both files rank 0 used came from node n1: its own (the range with w0 failed its block check on n0's copy and
    # was read from n1's partner copy) and rank 1's (received from rank 1). Intact, its own file counts as "local".
    assert lines[0]["last_restore"]["sources"] == {"partner": 2}, lines[0]
