"""Residency against real buckets on the session's moto server, and POSIX region labels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptio.errors import ConfigError, ResidencyError, StoreCapabilityError
from ckptio.policy.residency import Residency, check_residency, resolve_residency
from ckptio.storage import PosixStorage
from ckptio.storage.s3.s3_storage import S3Storage
from ckptio.testing.wrappers import FaultStorage, LatencyStorage


def _object_count(s3_client: Any, bucket: str) -> int:
    return int(s3_client.list_objects_v2(Bucket=bucket).get("KeyCount", 0))


@pytest.mark.s3
@pytest.mark.parametrize("public", ["policy", "acl"])
def test_public_bucket_is_refused_before_any_write(
    public: str, make_bucket: Callable[..., str], s3_client: Any
) -> None:
    bucket = make_bucket("eu-west-1", public=public)
    storage = S3Storage(bucket, "ckpt")
    with pytest.raises(ResidencyError) as info:
        check_residency(storage, Residency())
    message = str(info.value)
    assert bucket in message and "public" in message and "allow_public=False" in message
    assert ("policy" if public == "policy" else "ACL") in message
    assert isinstance(info.value, PermissionError)
    assert _object_count(s3_client, bucket) == 0
    check_residency(storage, Residency(allow_public=True))  # an explicit opt-in passes


@pytest.mark.s3
def test_public_bucket_behind_a_wrapper_is_refused(make_bucket: Callable[..., str]) -> None:
    storage = LatencyStorage(FaultStorage(S3Storage(make_bucket(public="acl"))), seconds=0)
    with pytest.raises(ResidencyError):
        check_residency(storage, Residency())


@pytest.mark.s3
def test_wrong_region_is_refused(make_bucket: Callable[..., str], s3_client: Any) -> None:
    bucket = make_bucket("us-west-2")
    storage = S3Storage(bucket, "ckpt", region="us-east-1")  # the client's region is not the bucket's
    with pytest.raises(ResidencyError) as info:
        check_residency(storage, Residency(allowed_regions=["eu-west-1", "eu-central-1"]))
    message = str(info.value)
    assert bucket in message and "us-west-2" in message and "allowed_regions" in message
    assert _object_count(s3_client, bucket) == 0


@pytest.mark.s3
def test_private_bucket_in_allowed_region_passes(make_bucket: Callable[..., str]) -> None:
    storage = S3Storage(make_bucket("eu-central-1"), "ckpt")
    check_residency(storage, Residency(allowed_regions=["eu-west-1", "eu-central-1"]))
    check_residency(storage, Residency())


@pytest.mark.s3
def test_bucket_without_block_and_without_grants_passes(make_bucket: Callable[..., str]) -> None:
    # No public-access block at all is not public by itself: it takes a public policy or ACL too.
    check_residency(S3Storage(make_bucket(block_public=False)), Residency())


@pytest.mark.s3
def test_full_block_overrides_a_public_policy(make_bucket: Callable[..., str], s3_client: Any) -> None:
    bucket = make_bucket(public="policy")
    flags = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
    s3_client.put_public_access_block(
        Bucket=bucket, PublicAccessBlockConfiguration=dict.fromkeys(flags, True)
    )
    check_residency(S3Storage(bucket), Residency())


@pytest.mark.s3
def test_policy_made_public_during_a_run_is_caught_on_recheck(
    make_bucket: Callable[..., str], s3_client: Any
) -> None:
    bucket = make_bucket(block_public=False)
    storage = S3Storage(bucket)
    check_residency(storage, Residency())
    s3_client.put_bucket_acl(Bucket=bucket, ACL="public-read")
    with pytest.raises(ResidencyError):
        check_residency(storage, Residency())


@pytest.mark.s3
def test_unreadable_bucket_is_refused(s3_endpoint: str) -> None:
    with pytest.raises(ResidencyError) as info:
        check_residency(S3Storage("ckptio-missing-bucket", max_attempts=1), Residency())
    assert "cannot" in str(info.value)


def test_posix_region_labels(tmp_path: Path) -> None:
    labelled = PosixStorage(tmp_path, region="eu-west-1")
    check_residency(labelled, Residency(allowed_regions=["eu-west-1"]))
    with pytest.raises(ResidencyError, match="outside allowed_regions"):
        check_residency(labelled, Residency(allowed_regions=["us-east-1"]))
    unlabelled = PosixStorage(tmp_path)
    check_residency(unlabelled, Residency())  # no allow-list: nothing to check
    with pytest.raises(ResidencyError, match="no region label") as info:
        check_residency(unlabelled, Residency(allowed_regions=["eu-west-1"]))
    assert "region=" in str(info.value)
    check_residency(FaultStorage(labelled), Residency(allowed_regions=["eu-west-1"]))


@pytest.mark.parametrize("bad", ["eu-west-1", [], ["eu-west-1", ""]])
def test_bad_residency_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError):
        Residency(allowed_regions=bad)


@pytest.mark.s3
def test_a_store_without_placement_apis_is_a_named_error_unless_declared_private(
    make_s3rver_bucket: Callable[[], str], s3rver_endpoint: str
) -> None:
    # s3rver answers 501 NotImplemented to the public-access block, policy status and ACL calls.
    storage = S3Storage(make_s3rver_bucket(), "ckpt", endpoint_url=s3rver_endpoint)
    with pytest.raises(StoreCapabilityError) as info:
        check_residency(storage, Residency())
    message = str(info.value)
    assert "does not implement" in message and "store_private=True" in message
    check_residency(storage, Residency(store_private=True))  # the documented declaration
    check_residency(storage, Residency(allow_public=True))
    # A private declaration says nothing about where the bytes are: a region rule still needs the region API.
    with pytest.raises(StoreCapabilityError, match="region"):
        check_residency(storage, Residency(allowed_regions=["eu-west-1"], store_private=True))


@pytest.mark.s3
def test_declaring_private_never_overrides_a_store_that_says_public(make_bucket: Callable[..., str]) -> None:
    with pytest.raises(ResidencyError, match="public"):
        check_residency(S3Storage(make_bucket(public="policy")), Residency(store_private=True))


def test_resolve_residency_adds_the_separate_declarations() -> None:
    assert resolve_residency(None) == Residency()
    assert resolve_residency(None, allow_public=True).allow_public
    explicit = Residency(allowed_regions=["eu-west-1"], allow_public=True)
    resolved = resolve_residency(explicit, store_private=True)
    assert (resolved.allowed_regions, resolved.allow_public, resolved.store_private) == (("eu-west-1",), True, True)
    assert explicit.store_private is False  # the caller's object is not changed
