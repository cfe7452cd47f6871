"""Residency: may checkpoint bytes be written to this storage at all? (contract)

Owns the rule check run before the first byte of a job is written and again every so often during the run
(a bucket policy can change under a running job): the storage's region against an allow-list, and, for S3,
whether the bucket is public. It must never write, and never change a bucket setting; it only reads.

Public (S3) means: the bucket's public-access block is absent or not fully on, AND either its policy status
says ``IsPublic`` or its ACL grants to AllUsers/AuthenticatedUsers. A bucket whose settings cannot be read
is refused: a residency check that cannot see is not a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptio.errors import ConfigError, ResidencyError, StorageError
from ckptio.storage.base import Storage

__all__ = ["Residency", "check_residency"]

_PUBLIC_GROUPS = (
    "http://acs.amazonaws.com/groups/global/AllUsers",
    "http://acs.amazonaws.com/groups/global/AuthenticatedUsers",
)
_BLOCK_FLAGS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


@dataclass(kw_only=True, slots=True)
class Residency:
    """Where checkpoints may be written."""

    allowed_regions: Sequence[str] | None = None
    """Regions the data may live in (``["eu-west-1", "eu-central-1"]``); None allows any region. A POSIX
    root must then carry a declared region label (``PosixStorage(..., region="eu-west-1")``)."""

    allow_public: bool = False
    """Allow a public bucket (by policy or ACL). Off by default: weights never go to a public bucket."""

    def __post_init__(self) -> None:
        if isinstance(self.allowed_regions, str):
            raise ConfigError("allowed_regions must be a list of regions, not one string")
        if self.allowed_regions is not None:
            regions = tuple(self.allowed_regions)
            if not regions or not all(isinstance(r, str) and r for r in regions):
                raise ConfigError("allowed_regions must be None or a non-empty list of region names")
            self.allowed_regions = regions


def check_residency(storage: Storage, residency: Residency) -> None:
    """Raise :class:`~ckptio.errors.ResidencyError` naming the storage and the rule it breaks; else return."""
    target = _innermost(storage)
    if residency.allowed_regions is not None:
        _check_region(target, residency.allowed_regions)
    if not residency.allow_public and _is_s3(target):
        _check_not_public(target)


def _innermost(storage: Storage) -> Storage:
    # Wrappers (throttle, latency, faults) change behaviour, never where the bytes land.
    while hasattr(storage, "inner") and isinstance(storage.inner, Storage):
        storage = storage.inner
    return storage


def _is_s3(storage: Storage) -> bool:
    from ckptio.storage.s3 import S3Storage

    return isinstance(storage, S3Storage)


def _check_region(storage: Storage, allowed: Sequence[str]) -> None:
    try:
        region = storage.region
    except Exception as exc:
        raise ResidencyError(
            f"cannot read the region of {storage.url} ({exc}); rule: allowed_regions={list(allowed)}",
            root=storage.url,
        ) from exc
    if region is None:
        raise ResidencyError(
            f"{storage.url} has no region label, and residency allows only {list(allowed)}: declare the "
            f"region of this filesystem (e.g. PosixStorage(path, region=...)) or drop allowed_regions",
            root=storage.url,
        )
    if region not in allowed:
        raise ResidencyError(
            f"{storage.url} is in region {region!r}, outside allowed_regions={list(allowed)}",
            root=storage.url,
        )


def _check_not_public(storage: Any) -> None:
    bucket, client = storage.bucket, storage.client
    block = _read(
        storage,
        "public-access block",
        lambda: client.get_public_access_block(Bucket=bucket),
        missing=("NoSuchPublicAccessBlockConfiguration",),
    )
    config = (block or {}).get("PublicAccessBlockConfiguration", {})
    if all(config.get(flag) for flag in _BLOCK_FLAGS):
        return  # a full block overrides any policy or ACL
    status = _read(
        storage,
        "policy status",
        lambda: client.get_bucket_policy_status(Bucket=bucket),
        missing=("NoSuchBucketPolicy",),
    )
    if (status or {}).get("PolicyStatus", {}).get("IsPublic"):
        raise ResidencyError(
            f"bucket {bucket!r} is public: its bucket policy grants public access and its public-access "
            f"block is not fully on; rule: allow_public=False",
            root=storage.url,
        )
    acl = _read(storage, "ACL", lambda: client.get_bucket_acl(Bucket=bucket), missing=())
    for grant in (acl or {}).get("Grants", []):
        uri = grant.get("Grantee", {}).get("URI")
        if uri in _PUBLIC_GROUPS:
            raise ResidencyError(
                f"bucket {bucket!r} is public: its ACL grants {grant.get('Permission')} to "
                f"{uri.rsplit('/', 1)[-1]} and its public-access block is not fully on; "
                f"rule: allow_public=False",
                root=storage.url,
            )


def _read(storage: Any, what: str, call: Any, *, missing: tuple[str, ...]) -> dict[str, Any] | None:
    """One read-only bucket call (retried like any S3 request); None when the setting does not exist."""
    try:
        return storage._call("", call)
    except StorageError as exc:
        code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code")
        if code in missing:
            return None
        raise ResidencyError(
            f"cannot read the {what} of bucket {storage.bucket!r} ({exc.message}); a bucket whose exposure "
            f"cannot be checked is refused (rule: allow_public=False)",
            root=storage.url,
        ) from exc
