"""Where an S3 bucket's bytes live and who can read them: the placement capabilities of :class:`S3Storage`.

Owns the read-only bucket calls behind ``S3Storage.region`` (HeadBucket) and ``S3Storage.public_exposure()``
(public-access block, policy status, ACL), each sent through the storage's transport and retried like any
request. It must never write, and never change a bucket setting.

Public means: the bucket's public-access block is absent or not fully on, AND either its policy status says
``IsPublic`` or its ACL grants to AllUsers/AuthenticatedUsers. A setting that cannot be read raises
:class:`~ckptio.errors.StorageError` ("cannot read the … of bucket …"): the caller decides what an unknown means.
A store that does not implement the API at all (501 NotImplemented, 405, or a HeadBucket without the region
header: s3rver, many appliances and on-prem gateways) raises its subclass
:class:`~ckptio.errors.StoreCapabilityError`, so the caller can tell "this store has no such thing" from "this
identity may not read it".
"""

from __future__ import annotations

from typing import Any

from ckptio.errors import StorageError, StoreCapabilityError
from ckptio.storage.base import Exposure
from ckptio.storage.s3.options import status_code
from ckptio.storage.s3.transport import S3Transport

_PUBLIC_GROUPS = (
    "http://acs.amazonaws.com/groups/global/AllUsers",
    "http://acs.amazonaws.com/groups/global/AuthenticatedUsers",
)
_BLOCK_FLAGS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
# How a server says it has no such API (as opposed to "no permission" or "no such setting").
_UNSUPPORTED_STATUS = frozenset({501, 405})
_UNSUPPORTED_CODES = frozenset({"NotImplemented", "MethodNotAllowed"})



def read_region(store: S3Transport) -> str:
    """The bucket's own region (``x-amz-bucket-region``), not the client's signing region."""
    try:
        resp = store.request("head_bucket")
        headers = resp["ResponseMetadata"]["HTTPHeaders"]
    except StorageError as exc:
        # A HeadBucket sent to the wrong region answers 301/400 but still names the bucket's region.
        headers = getattr(exc.__cause__, "response", {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
        if "x-amz-bucket-region" not in headers:
            raise
    if "x-amz-bucket-region" not in headers:
        raise StoreCapabilityError(
            f"the store does not report the region of bucket {store.bucket!r} (its HeadBucket answer has no "
            "x-amz-bucket-region header)", root=store.url,
        )
    return str(headers["x-amz-bucket-region"])


def read_exposure(store: S3Transport) -> Exposure:
    """Whether the bucket is public, and why; StorageError when one of its settings cannot be read."""
    bucket = store.bucket
    block = _read(store, "public-access block", "get_public_access_block",
                  missing=("NoSuchPublicAccessBlockConfiguration",))
    config = (block or {}).get("PublicAccessBlockConfiguration", {})
    if all(config.get(flag) for flag in _BLOCK_FLAGS):
        # A full block overrides any policy or ACL.
        return Exposure(public=False, detail=f"bucket {bucket!r} has a full public-access block")
    status = _read(store, "policy status", "get_bucket_policy_status", missing=("NoSuchBucketPolicy",))
    if (status or {}).get("PolicyStatus", {}).get("IsPublic"):
        return Exposure(public=True, detail=f"bucket {bucket!r} is public: its bucket policy grants public "
                        "access and its public-access block is not fully on")
    acl = _read(store, "ACL", "get_bucket_acl", missing=())
    for grant in (acl or {}).get("Grants", []):
        uri = grant.get("Grantee", {}).get("URI")
        if uri in _PUBLIC_GROUPS:
            return Exposure(public=True, detail=f"bucket {bucket!r} is public: its ACL grants "
                            f"{grant.get('Permission')} to {uri.rsplit('/', 1)[-1]} and its public-access "
                            "block is not fully on")
    return Exposure(public=False, detail=f"bucket {bucket!r} grants no public access by policy or ACL")


def _read(store: S3Transport, what: str, operation: str, *, missing: tuple[str, ...]) -> dict[str, Any] | None:
    """One read-only bucket call; None when the setting does not exist."""
    try:
        return store.request(operation)
    except StorageError as exc:
        status, code = status_code(exc.__cause__)
        if code in missing:
            return None
        if status in _UNSUPPORTED_STATUS or code in _UNSUPPORTED_CODES:
            raise StoreCapabilityError(
                f"the store does not implement the {what} API of bucket {store.bucket!r} ({code or status})",
                root=store.url,
            ) from exc
        raise StorageError(
            f"cannot read the {what} of bucket {store.bucket!r} ({exc.message})", root=store.url
        ) from exc
