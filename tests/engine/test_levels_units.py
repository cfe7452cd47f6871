"""Issue 10's pieces without processes: partner placement, options, the local manifest, the partner server."""

from __future__ import annotations

import socket

import crc32c
import pytest

from ckptio.config import CheckpointerConfig
from ckptio.engine.levels import partner_ranks
from ckptio.engine.partner_server import PartnerServer, fetch_file, send_files
from ckptio.errors import ConfigError, CorruptCheckpointError, NotFoundError, ReplicationError
from ckptio.format import FileRecord, Manifest
from ckptio.format.local_manifest import (
    LocalManifest,
    level_rows,
    local_committed_steps,
    partner_copy_key,
    read_local_manifest,
    write_local_manifest,
)
from ckptio.storage import open_storage

PEERS = [(0, "a", "h", 1), (1, "a", "h", 2), (2, "b", "h", 3), (3, "b", "h", 4), (4, "c", "h", 5), (5, "c", "h", 6)]


def test_partners_are_the_same_local_rank_on_the_next_nodes():
    assert partner_ranks(PEERS, 0, 1) == (2,)
    assert partner_ranks(PEERS, 3, 1) == (5,)
    assert partner_ranks(PEERS, 5, 2) == (1, 3)
    with pytest.raises(ConfigError, match="replicas=3 needs 4 nodes"):
        partner_ranks(PEERS, 0, 3)


@pytest.mark.parametrize("bad", [{"durable_every": 0}, {"durable_every": 2}, {"replicas": -1},
                                 {"preempt_grace_s": -1.0}, {"partner_timeout_s": 0.0}, {"node_id": ""}])
def test_level_options_are_checked(bad, tmp_path):
    with pytest.raises(ConfigError):
        CheckpointerConfig(root=str(tmp_path), **bad)


def _manifest(step: int) -> LocalManifest:
    rec = FileRecord(name="__0_0-1.distcp", size=3, crc32c="00000000")
    return LocalManifest(manifest=Manifest(step=step, world_size=1, save_id=7, files={rec.name: rec}, total_bytes=3),
                         holders={rec.name: ["a", "b"]}, nodes={0: "a"})


def test_local_manifest_commits_once_and_round_trips(tmp_path):
    root = open_storage(str(tmp_path), fsync=False)
    write_local_manifest(root, _manifest(5))
    write_local_manifest(root, _manifest(5))  # a retry of the same save is fine
    got = read_local_manifest(root, 5)
    assert got is not None and got.holders == {"__0_0-1.distcp": ["a", "b"]} and got.nodes == {0: "a"}
    assert local_committed_steps(root) == [5] and level_rows(root)[5]["nodes"] == ["a", "b"]
    other = _manifest(5)
    other.manifest.save_id = 8
    with pytest.raises(Exception, match="already committed"):
        write_local_manifest(root, other)
    bad = _manifest(6)
    bad.holders = {"../x": ["a"]}
    root.put("levels/local/step-00000006/manifest.json", bad.to_json())
    with pytest.raises(CorruptCheckpointError):
        read_local_manifest(root, 6)


def test_partner_server_keeps_only_intact_copies_and_serves_them(tmp_path):
    local = open_storage(str(tmp_path / "node"), fsync=False)
    listener = socket.create_server(("127.0.0.1", 0))
    server = PartnerServer(listener, local, timeout_s=5.0)
    port = listener.getsockname()[1]
    src = tmp_path / "f"
    src.write_bytes(b"x" * 100_000)
    good = f"{crc32c.crc32c(src.read_bytes()):08x}"
    try:
        send_files("127.0.0.1", port, 3, [("__1_0-9.distcp", str(src), 100_000, good)], timeout_s=5.0, who="t")
        assert local.get(partner_copy_key(3, "__1_0-9.distcp")) == src.read_bytes()
        assert fetch_file("127.0.0.1", port, 3, "__1_0-9.distcp", timeout_s=5.0) == src.read_bytes()
        with pytest.raises(ReplicationError, match="checksum"):
            send_files("127.0.0.1", port, 4, [("__1_0-9.distcp", str(src), 100_000, "deadbeef")], timeout_s=5.0,
                       who="t")
        assert not local.exists(partner_copy_key(4, "__1_0-9.distcp"))
        with pytest.raises(NotFoundError):
            fetch_file("127.0.0.1", port, 4, "__1_0-9.distcp", timeout_s=5.0)
        with pytest.raises(NotFoundError):  # a name that leaves the step directory is refused
            fetch_file("127.0.0.1", port, 3, "../../etc", timeout_s=5.0)
    finally:
        server.close()
