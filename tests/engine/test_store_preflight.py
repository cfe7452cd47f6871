"""What a Checkpointer checks of its store before it writes anything, on two real S3 implementations.

moto honours conditional writes and has the public-access and region APIs; s3rver ignores If-None-Match and
If-Match and has neither API. On s3rver the default Checkpointer refuses with StoreCapabilityError before any
object is written, and ``commit="lease"`` (with ``store_private=True``) saves and restores bit-exact. On moto a
public bucket is refused by default, with or without ``residency``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
import torch

import ckptio
from ckptio import format as fmt
from ckptio.errors import CommitError, ConfigError, ResidencyError, StoreCapabilityError
from ckptio.format.keys import manifest_key
from ckptio.format.records import Manifest
from ckptio.storage import Storage
from ckptio.storage.base import Data, ObjectInfo, Pacer, PutMode
from ckptio.storage.s3.s3_storage import S3Storage
from ckptio.storage.storage_wrapper import StorageWrapper
from tests.engine.engine_workers import model_state

pytestmark = pytest.mark.s3


def _keys(endpoint: str | None, bucket: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_s3rver_default_checkpointer_refuses_before_writing(
    make_s3rver_bucket: Callable[[], str], s3rver_endpoint: str
) -> None:
    bucket = make_s3rver_bucket()
    root, opts = f"s3://{bucket}/run", {"endpoint_url": s3rver_endpoint}
    # Residency first: s3rver has no API that could say whether the bucket is public.
    with pytest.raises(StoreCapabilityError) as info:
        ckptio.Checkpointer(root, storage_options=opts)
    assert "public" in str(info.value) and "store_private=True" in str(info.value)
    assert _keys(s3rver_endpoint, bucket) == []
    # Declared private: the capability probe finds conditional writes ignored, and says what that means.
    with pytest.raises(StoreCapabilityError) as info:
        ckptio.Checkpointer(root, storage_options=opts, store_private=True)
    message = str(info.value)
    assert "does not honour conditional writes" in message
    assert "overwrite each other's manifest" in message and 'commit="lease"' in message
    assert "If-None-Match" in message and "If-Match" in message
    assert _keys(s3rver_endpoint, bucket) == [], "nothing written: the probe's sentinels are removed"


def test_s3rver_lease_mode_saves_and_restores_bit_exact(
    make_s3rver_bucket: Callable[[], str], s3rver_endpoint: str
) -> None:
    bucket = make_s3rver_bucket()
    root, opts = f"s3://{bucket}/run", {"endpoint_url": s3rver_endpoint}
    states = {step: model_state(step) for step in (1, 2)}
    with ckptio.Checkpointer(root, storage_options=opts, store_private=True, commit="lease") as ck:
        for step, state in states.items():
            ck.save(step, state).wait(timeout=120)
        target = model_state(0)
        assert ck.restore(target) == 2
        assert ck.latest_step() == 2
    for key, tensor in states[2].items():
        assert target[key].dtype == tensor.dtype
        assert target[key].view(torch.uint8).equal(tensor.view(torch.uint8)), key  # bit-exact, bf16 included
    storage = S3Storage(bucket, "run", endpoint_url=s3rver_endpoint)
    assert fmt.read_latest(storage) == 2
    assert fmt.verify_step(storage, 2).ok


def test_moto_public_bucket_is_refused_by_default(make_bucket: Callable[..., str], s3_client: Any) -> None:
    bucket = make_bucket(public="policy")
    with pytest.raises(ResidencyError, match=bucket):
        ckptio.Checkpointer(f"s3://{bucket}/run")  # residency=None: the default still refuses public buckets
    assert _keys(None, bucket) == []
    with pytest.raises(ResidencyError):
        ckptio.Checkpointer(f"s3://{bucket}/run", residency=ckptio.Residency(allowed_regions=["us-east-1"]))
    assert _keys(None, bucket) == []
    with ckptio.Checkpointer(f"s3://{bucket}/run", allow_public=True) as ck:  # the explicit opt-in
        ck.save(1, {"w": torch.ones(8)}).wait(timeout=120)
    assert "run/step-00000001/manifest.json" in _keys(None, bucket)


def test_writer_rechecks_the_default_residency() -> None:
    config = ckptio.CheckpointerConfig(root="/tmp/x", allow_public=True)
    residency = config.writer_config().residency
    assert residency is not None and residency.allow_public and not residency.store_private
    assert ckptio.CheckpointerConfig(root="/tmp/x").writer_config().residency == ckptio.Residency()


@pytest.mark.parametrize("options", [{"commit": "lease", "lease_s": 0}, {"commit": "optimistic"},
                                     {"store_private": "yes"}])
def test_bad_commit_options_are_config_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ckptio.CheckpointerConfig(root="/tmp/x", **options)


class _OverwrittenAfterPut(StorageWrapper):
    """Another writer's manifest lands right after ours: the interleaving lease mode's read-back must catch.
    (A wrapper on a real s3rver store: the race itself cannot be timed reliably between two real committers.)"""

    def __init__(self, inner: Storage, key: str, other: bytes) -> None:
        super().__init__(inner)
        self.key, self.other = key, other

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        info = self.inner.put(key, data, mode=mode, pacer=pacer)
        if key == self.key:
            self.inner.put(key, self.other, mode="create")  # s3rver ignores the condition: it replaces ours
        return info


def _manifest(step: int, save_id: int) -> Manifest:
    return Manifest(step=step, world_size=1, save_id=save_id, files={}, total_bytes=0, versions={},
                    metadata_crc32c="")


def test_lease_mode_read_back_catches_a_replaced_manifest(
    make_s3rver_bucket: Callable[[], str], s3rver_endpoint: str
) -> None:
    inner = S3Storage(make_s3rver_bucket(), "lease", endpoint_url=s3rver_endpoint)
    ours, theirs = _manifest(3, save_id=111), _manifest(3, save_id=222)
    racing = _OverwrittenAfterPut(inner, manifest_key(3), theirs.to_json())
    with pytest.raises(CommitError, match="replaced this step's manifest"):
        fmt.write_manifest(racing, ours, verify=True)
    fmt.write_manifest(inner, _manifest(4, save_id=5), verify=True)  # alone, the read-back confirms the commit
    assert fmt.read_manifest(inner, 4).save_id == 5
