"""S3 (and S3-protocol) storage: the durable tier of a checkpoint root ``s3://bucket/prefix``.

Owns multipart uploads, conditional writes (``If-None-Match: *`` for create-only, ``If-Match`` for
compare-and-swap) and what a lost condition means. Every request goes through the storage's transport
(:mod:`ckptio.storage.s3.transport`: the client, retries, error mapping); options and the retry classification live
in :mod:`ckptio.storage.s3.options`; the bucket's placement (region, public exposure) is read by
:mod:`ckptio.storage.s3.bucket`. It must never hand a half-written object to a reader (PUT and
CompleteMultipartUpload are atomic on S3), never leave a multipart upload open after a failure it saw, and never
retry a request whose failure is permanent.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from ckptio.errors import ConfigError, NotFoundError, StorageError
from ckptio.storage.base import (
    HASHED_DIR_PREFIX,
    Buffer,
    Data,
    Exposure,
    IfMatch,
    ObjectInfo,
    Pacer,
    PutMode,
    Storage,
    WriteConditions,
    WriteMode,
    as_buffers,
    check_put_mode,
    hashed_key,
    join_key,
)
from ckptio.storage.root import Root
from ckptio.storage.s3 import ranged_read
from ckptio.storage.s3.bucket import read_exposure, read_region
from ckptio.storage.s3.conditions import condition_lost, lost_condition_error
from ckptio.storage.s3.options import S3Options, status_code
from ckptio.storage.s3.parts import CHECKSUM_ALGORITHM, FileSlice, MiB, SegmentReader, choose_part_size, split_parts
from ckptio.storage.s3.s3_root import S3Root, parse_s3_url
from ckptio.storage.s3.transport import S3Transport

# HASHED_DIR_PREFIX, hashed_key and MiB are re-exported: callers imported them from here before.
__all__ = ["HASHED_DIR_PREFIX", "MiB", "S3Options", "S3Storage", "hashed_key"]

# User metadata naming the write (a random token per put call): how a retried conditional write recognises
# its own earlier success. S3 returns it on HEAD as x-amz-meta-ckptio-write.
_TOKEN_META = "ckptio-write"
_CONDITIONS = WriteConditions(create="If-None-Match: *", swap="If-Match")

_Body = Callable[[], SegmentReader | FileSlice]  # a fresh reader per attempt: botocore may have read the last


class S3Storage(Storage):
    """A bucket prefix as a key space. Picklable: each process opens its own boto3 client on first use."""

    def __init__(self, bucket: str, prefix: str = "", **options: Any) -> None:
        if not bucket or "/" in bucket:
            raise ConfigError(f"invalid bucket name {bucket!r}")
        try:
            self.options = S3Options(**options)
        except TypeError as exc:
            raise ConfigError(f"unknown S3 option: {exc}") from None
        self.bucket = bucket
        self.prefix = join_key(prefix)
        self.transport = S3Transport(bucket, self.prefix, self.options)
        self._bucket_region: str | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Storage:
        """``s3://bucket/prefix`` → storage; ``options`` are :class:`S3Options` fields."""
        if not url.lower().startswith("s3://"):
            raise ConfigError(f"not an s3:// URL: {url!r}")
        return cls.open_root(parse_s3_url(url), **options)

    @classmethod
    def open_root(cls, root: Root, **options: Any) -> S3Storage:
        """The storage of an ``s3://`` root (the scheme registry's entry point)."""
        if not isinstance(root, S3Root):
            raise ConfigError(f"not an S3 root: {root.url}")
        return cls(root.bucket, root.prefix, **options)

    # ---- capabilities --------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.transport.url

    @property
    def store_id(self) -> str:
        """The URL and the endpoint it is reached at: one bucket name on two servers is two stores."""
        endpoint = self.options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") \
            or os.environ.get("AWS_ENDPOINT_URL") or "aws"
        return f"{self.url} at {endpoint}"

    @property
    def write_conditions(self) -> WriteConditions:
        return _CONDITIONS

    @property
    def writes_in_parts(self) -> bool:
        return True

    @property
    def hash_prefix(self) -> bool:
        return self.options.hash_prefix

    @property
    def read_batch_bytes(self) -> int:
        return self.options.read_part_size

    @property
    def region(self) -> str | None:
        """The bucket's region (HeadBucket ``x-amz-bucket-region``), read once per process."""
        if self._bucket_region is None:
            self._bucket_region = read_region(self.transport)
        return self._bucket_region

    def public_exposure(self) -> Exposure:
        """Read now, never cached: a bucket policy or ACL can change under a running job."""
        return read_exposure(self.transport)

    @property
    def client(self) -> Any:
        """This process's boto3 S3 client (the transport's)."""
        return self.transport.client

    @property
    def stats(self) -> dict[str, int]:
        """Requests sent and retries made by this process (for probes, benches and tests)."""
        return self.transport.stats

    def __getstate__(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "prefix": self.prefix, "options": asdict(self.options),
                "bucket_region": self._bucket_region}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["bucket"], state["prefix"], **state["options"])  # type: ignore[misc]
        self._bucket_region = state["bucket_region"]

    # ---- primitives ----------------------------------------------------------------------------------------
    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        # Paced per request: each part (or the single PUT) waits for its bytes before it starts, never a request
        # body midway, since botocore reads a body more than once (checksums, retries).
        check_put_mode(mode)
        buffers = as_buffers(data)
        total = sum(b.nbytes for b in buffers)
        if total <= self.options.multipart_threshold:
            if pacer is not None:
                pacer.take(total)
            return self._put_single(key, lambda: SegmentReader(buffers), total, mode)
        part = choose_part_size(total, self.options.part_size)
        bodies = [functools.partial(SegmentReader, s) for s in split_parts(buffers, part)]
        return self._put_multipart(key, bodies, total, mode, pacer)

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        check_put_mode(mode)
        size = os.path.getsize(path)
        if size <= self.options.multipart_threshold:
            with open(path, "rb") as f:
                return self.put(key, f.read(), mode=mode, pacer=pacer)
        part = choose_part_size(size, self.options.part_size)
        fd = os.open(path, os.O_RDONLY)
        try:
            bodies = [functools.partial(FileSlice, fd, o, min(part, size - o)) for o in range(0, size, part)]
            return self._put_multipart(key, bodies, size, mode, pacer)
        finally:
            os.close(fd)

    def put_parts(self, key: str, parts: Sequence[bytes], *, mode: PutMode = "overwrite") -> ObjectInfo:
        """``parts`` as the parts of one multipart upload, whatever their size (the capability probe's check that
        the store completes multipart uploads: one small part is a valid upload, being the last part)."""
        check_put_mode(mode)
        bodies = [functools.partial(SegmentReader, [memoryview(p)]) for p in parts]
        return self._put_multipart(key, bodies, sum(len(p) for p in parts), mode)

    @staticmethod
    def _conditions(mode: PutMode) -> dict[str, str]:
        if isinstance(mode, IfMatch):
            return {"IfMatch": f'"{mode.etag.strip(chr(34))}"'}
        return {"IfNoneMatch": "*"} if mode == "create" else {}

    def _checksum(self, body: SegmentReader | FileSlice | None) -> dict[str, str]:
        """CRC32C arguments of an upload request (of CreateMultipartUpload: the declaration), unless turned off."""
        if not self.transport.sends_checksums:
            return {}
        return {"ChecksumAlgorithm": CHECKSUM_ALGORITHM} if body is None else body.checksum_args()

    def _put_single(self, key: str, body: _Body, size: int, mode: PutMode) -> ObjectInfo:
        full, token = self.transport.object_key(key), secrets.token_hex(8)
        attempts: list[int] = []
        extra = {**self._conditions(mode), **self._checksum(body())}
        try:
            resp = self.transport.call(
                key,
                lambda client: client.put_object(
                    Bucket=self.bucket, Key=full, Body=body(), ContentLength=size,
                    Metadata={_TOKEN_META: token}, **extra,
                ),
                attempts_seen=attempts,
            )
        except StorageError as exc:
            return self._settle_conflict(key, exc, token, mode, attempts)
        return ObjectInfo(key=join_key(key), size=size, etag=_etag(resp["ETag"]))

    def _put_multipart(
        self,
        key: str,
        bodies: Sequence[_Body],
        size: int,
        mode: PutMode,
        pacer: Pacer | None = None,
    ) -> ObjectInfo:
        full, token = self.transport.object_key(key), secrets.token_hex(8)
        extra = self._conditions(mode)
        upload_id = self.transport.request("create_multipart_upload", key, Metadata={_TOKEN_META: token},
                                           **self._checksum(None))["UploadId"]
        try:
            parts = self._upload_parts(key, full, upload_id, bodies, pacer)
            attempts: list[int] = []
            try:
                resp = self.transport.call(
                    key,
                    lambda client: client.complete_multipart_upload(
                        Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}, **extra,
                    ),
                    attempts_seen=attempts,
                )
            except StorageError as exc:
                return self._settle_conflict(key, exc, token, mode, attempts)
        except BaseException:
            self._abort(key, upload_id)
            raise
        return ObjectInfo(key=join_key(key), size=size, etag=_etag(resp["ETag"]))

    def _upload_parts(
        self, key: str, full: str, upload_id: str, bodies: Sequence[_Body],
        pacer: Pacer | None = None,
    ) -> list[dict[str, Any]]:
        """Each part's entry of CompleteMultipartUpload: number, ETag and the CRC32C S3 verified on receipt."""
        def upload(number: int) -> dict[str, Any]:
            body = bodies[number - 1]
            if pacer is not None:
                pacer.take(len(body()))
            checksum = self._checksum(body())  # once: every attempt sends the bytes this was computed over
            resp = self.transport.call(
                key,
                lambda client: client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body(), **checksum
                ),
            )
            entry = {"PartNumber": number, "ETag": str(resp["ETag"])}
            return entry | ({"ChecksumCRC32C": checksum["ChecksumCRC32C"]} if checksum else {})

        workers = min(self.options.max_concurrency, len(bodies))
        with ThreadPoolExecutor(workers, thread_name_prefix="ckptio-s3-part") as pool:
            futures = [pool.submit(upload, n) for n in range(1, len(bodies) + 1)]
            try:
                return [f.result() for f in futures]
            finally:
                for f in futures:  # a failed part stops the rest from starting; running ones finish
                    f.cancel()

    def _abort(self, key: str, upload_id: str) -> None:
        # The original failure matters more; a lifecycle rule reaps what an abort could not.
        with contextlib.suppress(StorageError):
            self.transport.request("abort_multipart_upload", key, UploadId=upload_id)

    def _settle_conflict(
        self, key: str, exc: StorageError, token: str, mode: PutMode, attempts: list[int]
    ) -> ObjectInfo:
        """Turn a lost condition into AlreadyExists/Precondition (``s3_conditions``), unless the object is our own
        earlier write: after a retry, the stored write token decides whether the winner was us."""
        retried = len(attempts) > 1
        if not condition_lost(exc, mode, retried=retried):
            raise exc
        if retried:
            try:
                info, stored_token = self._head_with_token(key)
            except NotFoundError:
                info, stored_token = None, None
            if info is not None and stored_token == token:
                return info
        error = lost_condition_error(exc, key, mode, root=self.url)
        if error is exc:
            raise exc
        raise error from None

    def _head_with_token(self, key: str) -> tuple[ObjectInfo, str | None]:
        resp = self.transport.request("head_object", key)
        info = ObjectInfo(key=join_key(key), size=int(resp["ContentLength"]), etag=_etag(resp["ETag"]))
        return info, resp.get("Metadata", {}).get(_TOKEN_META)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        if offset < 0 or (length is not None and length < 0):
            raise StorageError(f"invalid range offset={offset} length={length} on {key!r}", root=self.url)
        if length == 0:
            self.head(key)  # a missing key still raises NotFoundError
            return b""
        full = self.transport.object_key(key)
        extra = {}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            extra["Range"] = f"bytes={offset}-{end}"

        def fetch(client: Any) -> bytes:
            body: bytes = client.get_object(Bucket=self.bucket, Key=full, **extra)["Body"].read()
            return body

        try:
            return self.transport.call(key, fetch)
        except StorageError as exc:
            if status_code(exc.__cause__)[0] == 416:  # offset at or past the end: POSIX reads b""
                return b""
            raise

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int:
        return ranged_read.readinto(self.transport, key, as_buffers(buffers), offset)

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        if len(keys) <= 1:
            return {k: self.get(k) for k in keys}
        with ThreadPoolExecutor(
            min(self.options.max_concurrency, len(keys)), thread_name_prefix="ckptio-s3-get"
        ) as pool:
            return dict(zip(keys, pool.map(self.get, keys), strict=True))

    def head(self, key: str) -> ObjectInfo:
        return self._head_with_token(key)[0]

    def _pages(self, **params: Any) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages, each request retried alone (a boto3 paginator dies at its first error)."""
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self.transport.request("list_objects_v2", **params, **extra)
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        for page in self._pages(Prefix=base + prefix):
            for item in page.get("Contents", ()):
                yield ObjectInfo(
                    key=item["Key"][len(base) :], size=int(item["Size"]), etag=_etag(item["ETag"])
                )

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        base = join_key(self.prefix, prefix)
        base = base + "/" if base else ""
        names: set[str] = set()
        for page in self._pages(Prefix=base, Delimiter="/"):
            names.update(p["Prefix"][len(base) :].rstrip("/") for p in page.get("CommonPrefixes", ()))
        return sorted(n for n in names if n)

    def delete(self, key: str) -> None:
        self.transport.request("delete_object", key)

    def delete_prefix(self, prefix: str) -> int:
        base = join_key(prefix)
        keys = [self.transport.object_key(i.key) for i in self.list(base + "/" if base else "")]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = {"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True}
            resp = self.transport.request("delete_objects", Delete=batch)
            if resp.get("Errors"):
                first = resp["Errors"][0]
                raise StorageError(f"delete of {first.get('Key')} failed: {first.get('Code')}", root=self.url)
        return len(keys)

    def close(self) -> None:
        self.transport.close()


def _etag(raw: str) -> str:
    return raw.strip('"')
