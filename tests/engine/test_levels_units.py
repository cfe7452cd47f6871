"""Issue 10's pieces without processes: partner placement, options, the local manifest and its digests (the
partner server itself: test_partner_security.py)."""

from __future__ import annotations

import json

import pytest

from ckptio.config import CheckpointerConfig
from ckptio.engine.levels import partner_ranks
from ckptio.errors import ConfigError, CorruptCheckpointError
from ckptio.format import FileRecord, Manifest, RankIndex
from ckptio.format.local_manifest import (
    LocalManifest,
    LocalRankIndex,
    level_rows,
    local_committed_steps,
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


DIGEST = "sha256:" + "ab" * 32


def test_digests_round_trip_and_records_without_them_still_parse(tmp_path):
    root = open_storage(str(tmp_path), fsync=False)
    manifest = _manifest(5)
    manifest.digests = {"__0_0-1.distcp": DIGEST}
    write_local_manifest(root, manifest)
    got = read_local_manifest(root, 5)
    assert got is not None and got.digests == {"__0_0-1.distcp": DIGEST}
    index = LocalRankIndex(index=RankIndex(step=5, rank=0, world_size=1, save_id=7, files=list(
        manifest.manifest.files.values()), items=[]), node="a", holders=["a", "b"], digests=dict(manifest.digests))
    assert LocalRankIndex.from_json(index.to_json()).digests == manifest.digests

    # Written before digests existed: parses, with no digests (restore then uses no partner copy of it).
    old_manifest = json.loads(manifest.to_json())
    del old_manifest["digests"]
    root.put("levels/local/step-00000006/manifest.json",
             json.dumps({**old_manifest, "manifest": {**old_manifest["manifest"], "step": 6}}).encode())
    old = read_local_manifest(root, 6)
    assert old is not None and old.digests == {}
    old_index = json.loads(index.to_json())
    del old_index["digests"]
    assert LocalRankIndex.from_json(json.dumps(old_index).encode()).digests == {}


@pytest.mark.parametrize("digests", [{"__0_0-1.distcp": "crc32c:00000000"}, {"__0_0-1.distcp": "sha256:AB"},
                                     {"__9_9-9.distcp": DIGEST}, ["x"]])
def test_malformed_digests_are_corrupt_records(digests):
    body = json.loads(_manifest(5).to_json())
    body["digests"] = digests
    with pytest.raises(CorruptCheckpointError):
        LocalManifest.from_json(json.dumps(body).encode())
