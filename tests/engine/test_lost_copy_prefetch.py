"""Which rank of which node fetches its files back ahead of a restore. The whole path, with real partner servers
and a lost node: test_two_levels.py::test_node_loss_restores_from_partners_bit_exact_newer_than_durable.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptio.engine.protocol import Peer
from ckptio.engine.restore.context import LocalLevel
from ckptio.engine.restore.lost_copy_prefetch import LostCopyPrefetch, Prefetched, fetch_from_holders
from ckptio.errors import ChecksumError
from ckptio.format import FileRecord
from ckptio.format.local_level_records import local_records, own_copy_key, partner_copy_key
from ckptio.storage import PosixStorage

PEERS = (Peer(0, "n0", "127.0.0.1", 1), Peer(1, "n0", "127.0.0.1", 2), Peer(2, "n1", "127.0.0.1", 3))


def _level(tmp_path: Path, node: str) -> LocalLevel:
    return LocalLevel(local_records(PosixStorage(tmp_path / "root")), node, PEERS, b"s" * 32, 5.0)


def test_only_the_lowest_rank_of_a_node_with_an_empty_local_dir_fetches(tmp_path: Path) -> None:
    local = PosixStorage(tmp_path / "local")
    started = LostCopyPrefetch.start_if_replaced(_level(tmp_path, "n0"), local, rank=0)
    assert started is not None
    assert started.wait(30.0) == Prefetched()  # no committed local-level step: nothing to fetch
    assert LostCopyPrefetch.start_if_replaced(_level(tmp_path, "n0"), local, rank=1) is None


@pytest.mark.parametrize("kept", [own_copy_key(4, "__0_0.distcp"), partner_copy_key(4, "__2_0.distcp")])
def test_a_node_that_kept_its_disk_fetches_nothing(tmp_path: Path, kept: str) -> None:
    local = PosixStorage(tmp_path / "local")
    local.put(kept, b"x")
    assert LostCopyPrefetch.start_if_replaced(_level(tmp_path, "n0"), local, rank=0) is None


def test_a_record_without_a_digest_is_never_fetched(tmp_path: Path) -> None:
    record = FileRecord(name="__2_0.distcp", size=1, crc32c="00000000", holders=["n1", "n0"])
    with pytest.raises(ChecksumError, match="no partner digest"):  # refused before any connection is tried
        fetch_from_holders(_level(tmp_path, "n1"), 4, record, str(tmp_path / "dest"), holders=["n0"])
    assert not (tmp_path / "dest").exists()
