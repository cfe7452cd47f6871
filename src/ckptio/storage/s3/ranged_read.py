"""Ranged S3 reads straight into the caller's buffers: concurrent GETs, each response streamed into its slice.

A restore asks for a byte range and already has where the bytes go (a tensor's memory, a bounce buffer).
``get_object(...)["Body"].read()`` would build a ``bytes`` of the whole range and the caller would copy it again;
here each part's response is read from the socket into its own slice of the buffers (``readinto`` on the HTTP
response), so a byte is copied once, by the kernel. A range larger than ``S3Options.read_part_size`` is split
into parts fetched concurrently (``S3Options.max_concurrency``), as boto3's ``download_fileobj`` and s5cmd do.

Requests go through the storage's transport (:class:`~ckptio.storage.s3.transport.S3Transport`), which retries
them: a part whose transfer fails is fetched again from its start,
overwriting what the failed attempt left in its slice. Nothing here decides whether bytes are right: the caller
checks its checksums.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ckptio.errors import StorageError
from ckptio.storage.s3.options import status_code
from ckptio.storage.s3.transport import S3Transport


def slice_views(views: Sequence[memoryview], start: int, length: int) -> list[memoryview]:
    """The parts of the concatenation of ``views`` from ``start``, ``length`` bytes long, as views (no copy)."""
    out, pos = [], 0
    for view in views:
        lo, hi = max(start - pos, 0), min(start + length - pos, view.nbytes)
        if lo < hi:
            out.append(view[lo:hi])
        pos += view.nbytes
    return out


def _fill(body: Any, views: Sequence[memoryview]) -> int:
    """Read ``body`` into ``views``; the bytes read (short when the body ends first)."""
    raw = getattr(body, "_raw_stream", None)
    http = getattr(raw, "_fp", None)
    encoded = bool(getattr(raw, "headers", {}).get("content-encoding"))
    # http.client's response reads a large request straight from the socket into the buffer; urllib3's and
    # botocore's wrappers would return bytes to copy. An encoded body needs their decoding: read it through them.
    direct = getattr(http, "readinto", None) if not encoded else None
    done = 0
    for view in views:
        pos = 0
        while pos < view.nbytes:
            if direct is not None:
                n = direct(view[pos:])
            else:
                chunk = body.read(min(view.nbytes - pos, 1 << 20))
                n = len(chunk)
                view[pos : pos + n] = chunk
            if not n:
                return done + pos
            pos += n
        done += pos
    return done


def _get_part(transport: S3Transport, key: str, start: int, views: Sequence[memoryview]) -> int:
    from botocore.exceptions import IncompleteReadError

    length = sum(v.nbytes for v in views)
    full = transport.object_key(key)

    def fetch(client: Any) -> int:
        resp = client.get_object(Bucket=transport.bucket, Key=full, Range=f"bytes={start}-{start + length - 1}")
        body = resp["Body"]
        expected = int(resp.get("ContentLength", length))
        try:
            got = _fill(body, views)
        except Exception as exc:
            body.close()  # a half-read response must not go back to the connection pool
            # A body cut off mid-way (reset, timeout, short read) is a transfer failure: retried like botocore's.
            raise IncompleteReadError(actual_bytes=0, expected_bytes=expected) from exc
        if got != expected:
            body.close()
            raise IncompleteReadError(actual_bytes=got, expected_bytes=expected)
        release = getattr(getattr(body, "_raw_stream", None), "release_conn", None)
        if release is not None:
            release()
        return got

    try:
        return transport.call(key, fetch)
    except StorageError as exc:
        if status_code(exc.__cause__)[0] == 416:  # the range starts at or past the end: nothing to read
            return 0
        raise


def readinto(transport: S3Transport, key: str, views: Sequence[memoryview], offset: int) -> int:
    """:meth:`ckptio.storage.base.Storage.readinto` for S3: ``read_part_size`` ranges fetched concurrently."""
    if offset < 0:
        raise StorageError(f"invalid range offset={offset} on {key!r}", root=transport.url)
    total = sum(v.nbytes for v in views)
    if total == 0:
        transport.request("head_object", key)  # a missing key still raises NotFoundError
        return 0
    part = transport.options.read_part_size
    starts = list(range(0, total, part))
    parts = [slice_views(views, s, min(part, total - s)) for s in starts]
    if len(parts) == 1:
        return _get_part(transport, key, offset, parts[0])
    workers = min(transport.options.max_concurrency, len(parts))
    with ThreadPoolExecutor(workers, thread_name_prefix="ckptio-s3-read") as pool:
        futures = [pool.submit(_get_part, transport, key, offset + s, p) for s, p in zip(starts, parts, strict=True)]
        try:
            got = [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
    done = 0
    for s, p, n in zip(starts, parts, got, strict=True):  # bytes up to the first short part (the object's end)
        done = s + n
        if n < sum(v.nbytes for v in p):
            break
    return done
