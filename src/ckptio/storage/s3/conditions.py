"""What a failed conditional S3 write means: which answers say the condition was lost, and the error that says so.

S3 answers a lost ``If-None-Match: *`` (create-only) or ``If-Match`` (compare-and-swap) with 412; an ``If-Match``
whose object is gone with 404; and a retried ``CompleteMultipartUpload`` that an earlier attempt already completed
with NoSuchUpload. Whether the winner was this very write (a retry after a lost response) is the caller's to check,
with the write token it stored in the object's metadata. No I/O here.
"""

from __future__ import annotations

from ckptio.errors import AlreadyExistsError, PreconditionError, StorageError
from ckptio.storage.base import IfMatch, PutMode
from ckptio.storage.s3.options import status_code


def condition_lost(exc: StorageError, mode: PutMode, *, retried: bool) -> bool:
    """Did ``exc`` (from a conditional put in ``mode``) say the condition was lost rather than the request failed?"""
    status, code = status_code(exc.__cause__)
    swap = isinstance(mode, IfMatch)
    return (status == 412 or (swap and status == 404 and code != "NoSuchBucket")
            or (code == "NoSuchUpload" and retried))


def lost_condition_error(exc: StorageError, key: str, mode: PutMode, *, root: str) -> StorageError:
    """The error of a lost condition: AlreadyExistsError (create-only), PreconditionError (compare-and-swap), or
    ``exc`` itself for a NoSuchUpload on an unconditional write that cannot be attributed."""
    status, _ = status_code(exc.__cause__)
    if not isinstance(mode, IfMatch):
        if status == 412:
            return AlreadyExistsError(f"{key!r} already exists", root=root, path=exc.path)
        return exc
    return PreconditionError(f"{key!r} changed since it was read (If-Match lost)", root=root, path=exc.path)
