"""The two levels' pieces without processes: partner placement, options, the local level's records and their
digests (the partner server itself: test_partner_security.py)."""

from __future__ import annotations

import json

import pytest

from ckptio.config import CheckpointerConfig
from ckptio.engine.protocol import Peer
from ckptio.engine.trainer.save_levels import partner_ranks
from ckptio.errors import CommitError, ConfigError, CorruptCheckpointError
from ckptio.format import FileRecord, Manifest, RankIndex, committed_steps, read_manifest, write_manifest
from ckptio.format.local_level_records import level_rows, local_records
from ckptio.storage import open_storage

PEERS = [Peer(rank, node, "h", rank + 1) for rank, node in enumerate("aabbcc")]


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


def test_the_local_levels_records_are_a_root_of_their_own(tmp_path):
    """The local level commits with the durable level's protocol, one directory down: create-only manifests,
    committed steps, and ``ls``'s rows read through the same functions."""
    root = open_storage(str(tmp_path), fsync=False)
    records = local_records(root)
    rec = FileRecord(name="__0_0-7.distcp", size=3, crc32c="00000000", holders=["a", "b"])
    write_manifest(records, Manifest(step=5, world_size=1, save_id=7, files={rec.name: rec}, total_bytes=3))
    write_manifest(records, Manifest(step=5, world_size=1, save_id=7, files={rec.name: rec}, total_bytes=3))
    assert root.exists("levels/local/step-00000005/manifest.json")
    assert committed_steps(records) == [5] and committed_steps(root) == []  # never mistaken for a durable step
    assert read_manifest(records, 5).files[rec.name].holders == ["a", "b"]
    assert level_rows(root)[5]["nodes"] == ["a", "b"]
    with pytest.raises(CommitError, match="already committed"):
        write_manifest(records, Manifest(step=5, world_size=1, save_id=8, files={}, total_bytes=0))
    bad = {"format": "ckptio-manifest/1", "step": 6, "world_size": 1, "save_id": 1, "total_bytes": 0,
           "files": {"x": {"name": "x", "size": 1, "crc32c": "0", "holders": "a"}}}
    root.put("levels/local/step-00000006/manifest.json", json.dumps(bad).encode())
    with pytest.raises(CorruptCheckpointError):
        read_manifest(records, 6)
    with pytest.raises(ConfigError):
        records.get("../manifest.json")  # a subtree never reaches above itself


DIGEST = "sha256:" + "ab" * 32


def test_digests_round_trip_and_records_without_them_still_parse(tmp_path):
    records = local_records(open_storage(str(tmp_path), fsync=False))
    rec = FileRecord(name="__0_0-1.distcp", size=3, crc32c="00000000", holders=["a"], digest=DIGEST)
    write_manifest(records, Manifest(step=5, world_size=1, save_id=7, files={rec.name: rec}, total_bytes=3))
    assert read_manifest(records, 5).files[rec.name].digest == DIGEST
    index = RankIndex(step=5, rank=0, world_size=1, save_id=7, files=[rec], items=[])
    assert RankIndex.from_json(index.to_json()).files[0].digest == DIGEST

    # Written before digests existed: parses, with no digest (restore then uses no partner copy of it).
    body = json.loads(index.to_json())
    for file in body["files"]:
        del file["digest"], file["holders"]
    assert RankIndex.from_json(json.dumps(body).encode()).files[0].digest == ""


@pytest.mark.parametrize("digest", ["crc32c:00000000", "sha256:AB", "sha256:" + "ab" * 31, 7])
def test_malformed_digests_are_corrupt_records(digest):
    index = RankIndex(step=5, rank=0, world_size=1, save_id=7, items=[],
                      files=[FileRecord(name="__0_0-1.distcp", size=3, crc32c="00000000", holders=["a"])])
    body = json.loads(index.to_json())
    body["files"][0]["digest"] = digest
    with pytest.raises(CorruptCheckpointError):
        RankIndex.from_json(json.dumps(body).encode())
