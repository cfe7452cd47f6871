"""Containment on S3 with hash-prefixed data keys (the real moto server): retention deletes a step's own hashed
keys, never another step's that a tampered manifest names."""

from __future__ import annotations

import pytest

from ckptio.format import Manifest, apply_retention, checksum, committed_steps, write_manifest
from ckptio.format.records import FileRecord
from ckptio.format.retention import RETIRED
from ckptio.storage.s3.s3_storage import S3Storage

pytestmark = pytest.mark.s3


def _commit(storage: S3Storage, step: int, files: dict[str, str]) -> None:
    """Put data (name -> key) and a manifest listing it, as a committer would."""
    records = {}
    for name, key in files.items():
        storage.put(key, b"data")
        records[name] = FileRecord(name=name, size=4, crc32c=checksum([b"data"]), key=key)
    write_manifest(storage, Manifest(step=step, world_size=1, save_id=step, files=records, total_bytes=4))


def test_retention_on_s3_deletes_only_each_steps_own_hashed_keys(s3_endpoint, s3_bucket):
    storage = S3Storage(s3_bucket, "root", endpoint_url=s3_endpoint, hash_prefix=True)
    theirs = "h-bbbb/step-00000003/b.distcp"
    _commit(storage, 1, {"a.distcp": "h-aaaa/step-00000001/a.distcp"})
    _commit(storage, 2, {"c.distcp": "h-cccc/step-00000002/c.distcp"})
    _commit(storage, 3, {"b.distcp": theirs})
    storage.put("h-aaaa/step-00000002/stray.distcp", b"leftover of step 2's failed attempt")
    storage.put("unrelated/keep", b"not ckptio's")
    # Step 2's manifest now also names step 3's data, under a name of its own.
    tampered = Manifest.from_json(storage.get("step-00000002/manifest.json")).to_json().replace(
        b'"files": {', b'"files": {"b.distcp": {"crc32c": "00000000", "key": "' + theirs.encode()
        + b'", "name": "b.distcp", "size": 4}, ', 1)
    storage.put("step-00000002/manifest.json", tampered)

    assert apply_retention(storage, keep_last=1, newest_committed=3) == [1, 2]
    assert committed_steps(storage) == [3]
    left = sorted(i.key for i in storage.list("") if i.key != RETIRED)  # RETIRED: retention's own record
    assert left == [theirs, "step-00000003/manifest.json", "unrelated/keep"]
    storage.close()
