"""The S3 backend's transport: the one object that sends requests to the bucket. (boto3 is called only here.)

Owns the client of each process (created on first use, never shared with a forked child), the retries (bounded
exponential backoff with full jitter, on transient failures only: :func:`~ckptio.storage.s3.options.is_transient`),
the request counters, the object key of a storage key (the storage's prefix joined on), and the mapping of an S3
failure onto :mod:`ckptio.errors`. The storage and its helpers (uploads, ranged reads, bucket placement) say *what*
to send; this says *how*. It is the seam a test or another client library plugs in at (httpx's transport habit).

Retries are ours, not botocore's (botocore's are switched off in :func:`~ckptio.storage.s3.options.make_client`):
a create-only write retried after an attempt whose outcome is unknown may meet 412 *because of its own earlier
success*; only the caller that knows it retried can tell (``attempts_seen``).

Picklable: it carries its settings only, and each process opens its own client.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from ckptio.errors import NotFoundError, StorageError
from ckptio.storage.base import join_key
from ckptio.storage.s3.options import S3Options, is_transient, make_client, sends_checksums, status_code

__all__ = ["S3Transport"]

_T = TypeVar("_T")


class S3Transport:
    """Requests to one bucket, for keys below one prefix."""

    def __init__(self, bucket: str, prefix: str, options: S3Options) -> None:
        self.bucket, self.prefix, self.options = bucket, prefix, options
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._client: Any = None
        self._client_pid = 0
        self._client_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        #: Requests sent and retries made by this process (for probes, benches and tests).
        self.stats = {"requests": 0, "retries": 0}

    def __getstate__(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "prefix": self.prefix, "options": asdict(self.options)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["bucket"], state["prefix"], S3Options(**state["options"]))  # type: ignore[misc]

    @property
    def client(self) -> Any:
        """This process's boto3 S3 client (thread-safe; created on first use)."""
        if self._client is None or self._client_pid != os.getpid():
            with self._client_lock:
                if self._client is None or self._client_pid != os.getpid():
                    # A forked child must not share the parent's connections: it opens its own client.
                    self._client, self._client_pid = make_client(self.options), os.getpid()
        return self._client

    @property
    def sends_checksums(self) -> bool:
        """Whether uploads carry ckptio's CRC32C (:func:`~ckptio.storage.s3.options.sends_checksums`)."""
        return sends_checksums(self.client)

    def object_key(self, key: str) -> str:
        """The bucket key of storage key ``key``; StorageError for an empty or absolute key."""
        clean = join_key(key)
        if not clean or key.startswith("/"):
            raise StorageError(f"invalid key {key!r}", root=self.url)
        return f"{self.prefix}/{clean}" if self.prefix else clean

    def list_prefix(self, prefix: str) -> str:
        """The bucket prefix that lists storage keys starting with ``prefix`` (matched as a string)."""
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def call(self, about: str, fn: Callable[[Any], _T], *, attempts_seen: list[int] | None = None) -> _T:
        """``fn(client)``, retried with backoff on transient failures; a failure for good raises the
        :mod:`ckptio.errors` class that says what it means (``about``: the key or prefix, for the message)."""
        opts = self.options
        for attempt in range(opts.max_attempts):
            self._count("requests")
            if attempts_seen is not None:
                attempts_seen.append(attempt)
            try:
                return fn(self.client)
            except Exception as exc:
                if not is_transient(exc) or attempt + 1 == opts.max_attempts:
                    raise self.error(exc, about) from exc
            self._count("retries")
            time.sleep(random.uniform(0, min(opts.retry_cap_s, opts.retry_base_s * 2**attempt)))
        raise AssertionError("unreachable")  # pragma: no cover

    def request(self, operation: str, key: str = "", **params: Any) -> dict[str, Any]:
        """One S3 operation on the bucket (``Bucket`` added, and ``Key`` when ``key`` names an object), retried.

        For requests whose body must be fresh at every attempt, use :meth:`call`."""
        if key:
            params["Key"] = self.object_key(key)
        about = key or str(params.get("Prefix", ""))

        def send(client: Any) -> dict[str, Any]:
            answer: dict[str, Any] = getattr(client, operation)(Bucket=self.bucket, **params)
            return answer

        return self.call(about, send)

    def error(self, exc: Exception, key: str) -> StorageError:
        """What the failure ``exc`` of a request about ``key`` means, as an error of :mod:`ckptio.errors`."""
        if isinstance(exc, StorageError):
            return exc
        status, code = status_code(exc)
        path = f"s3://{self.bucket}/{self.list_prefix(join_key(key))}" if key else self.url
        if code == "NoSuchBucket":
            return StorageError(f"bucket {self.bucket!r} does not exist", root=self.url, path=path)
        if status == 404 or code in ("NoSuchKey", "NotFound"):
            return NotFoundError(f"no such object {key!r}", root=self.url, path=path)
        if status is not None:
            return StorageError(f"S3 {code or status} on {key!r}: {exc}", root=self.url, path=path)
        return StorageError(f"S3 request failed on {key!r}: {exc}", root=self.url, path=path)

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self.stats[name] += 1

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
