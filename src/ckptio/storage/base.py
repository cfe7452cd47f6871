"""The one storage protocol every tier speaks.

A :class:`Storage` is a flat key space under one root (a POSIX directory or an S3 prefix). Keys use ``/`` as
separator and never start with it. The protocol is deliberately narrow — five primitives — and everything the
pipeline needs (commit, retention, restore, probe) is written once against it.

Guarantees every backend must keep (:mod:`ckptio.testing.conformance` checks them):

* ``put`` either writes the entirety of the data or fails; a reader never sees a partial object.
* ``put(mode="create")`` is create-only: it raises :class:`~ckptio.errors.AlreadyExistsError` when the key exists,
  and of several concurrent creators exactly one wins.
* ``put(mode=IfMatch(etag))`` replaces the object only while its etag is ``etag``, else
  :class:`~ckptio.errors.PreconditionError`.
* ``put`` is durable when it returns (POSIX: file and directory fsynced; S3: the PUT was acknowledged).
* Missing keys raise :class:`~ckptio.errors.NotFoundError`; ``delete`` of a missing key is not an error.

A write may be *paced*: ``put``/``put_file`` take an optional :class:`Pacer` whose ``take(n)`` the backend calls
before sending each piece of the object, so that the engine can spread a flush over the time until the next save
without ever changing what is written.

Besides the primitives a storage declares capabilities, read-only, so callers never look behind the protocol:
``url`` and ``store_id``, ``hash_prefix`` (data keys go under a short hash directory: :meth:`Storage.data_key`),
``write_conditions`` (what its conditional writes are made of, for messages), ``writes_in_parts``, its placement
(``region`` and :meth:`Storage.public_exposure`), and :meth:`Storage.local_directory` (its keys as files of this
host, or None). A wrapper reports its inner storage's capabilities. What a caller needs done across two storages
is a method, not a switch on the backend: :meth:`Storage.copy_to` copies one of its objects into another storage,
streaming from a file where it has one.

Storages are picklable: the writer process of every rank receives its own copy and must open its own clients.
They must never hold a lock or a connection that does not survive pickling.
This package must never import from the engine, the on-storage format or the policies built on top of it.
"""

from __future__ import annotations

import abc
import builtins
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ckptio.errors import ConfigError, NotFoundError, StorageError

# Anything exposing the buffer protocol: bytes, bytearray, memoryview, numpy arrays.
Buffer = bytes | bytearray | memoryview
Data = Buffer | Sequence[Buffer]
WriteMode = Literal["overwrite", "create"]
#: First path segment of hashed data keys (see :func:`hashed_key`).
HASHED_DIR_PREFIX = "h-"


@dataclass(frozen=True, slots=True)
class IfMatch:
    """The put mode of compare-and-swap: replace the object only while its etag is still ``etag``."""

    etag: str


#: How ``put`` treats an existing key: replace it, refuse it (create-only), or replace it only if unchanged.
PutMode = WriteMode | IfMatch


def check_put_mode(mode: PutMode) -> PutMode:
    """``mode`` itself, or :class:`~ckptio.errors.ConfigError` when it is none of the three put modes."""
    if isinstance(mode, IfMatch) or mode in ("overwrite", "create"):
        return mode
    raise ConfigError(f"mode must be 'overwrite', 'create' or IfMatch(etag), got {mode!r}")


class Pacer(Protocol):
    """Paces a write: a backend that sends an object in pieces calls :meth:`take` before each piece (one that
    cannot, once with the whole size), so that a flush can be spread over the time it really has."""

    def take(self, nbytes: int) -> None:
        """Return once ``nbytes`` more may be sent."""


@dataclass(frozen=True, slots=True)
class Exposure:
    """Who can read a storage beyond its owner: ``public`` and, in words, why (for residency messages)."""

    public: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class WriteConditions:
    """What a backend's two conditional writes are made of, in its own words (for messages and the probe)."""

    create: str
    """The create-only write (S3: ``If-None-Match: *``; POSIX: ``link()``)."""

    swap: str
    """The compare-and-swap (S3: ``If-Match``; POSIX: an exclusive lock file)."""


class LocalDirectory(Protocol):
    """A storage's keys as files of this host, for the few callers that must hand the kernel a path or a file
    descriptor (a partner socket's receive and send). Everyone else stays on the storage protocol."""

    @property
    def root(self) -> str:
        """The directory the keys are below."""

    def local_path(self, key: str) -> str:
        """The path of ``key``; StorageError when the key would leave the directory (``..``, a link)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``head``/``list`` know about one object."""

    key: str
    size: int
    etag: str


def as_buffers(data: Data) -> list[memoryview]:
    """Normalise ``put`` input into a list of flat byte views (no copies)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        parts: Sequence[Buffer] = [data]
    else:
        parts = data
    return [memoryview(p).cast("B") if memoryview(p).ndim != 1 or memoryview(p).itemsize != 1
            else memoryview(p) for p in parts]


def scatter(data: memoryview, views: Sequence[memoryview]) -> int:
    """Copy ``data`` into ``views`` in order, as far as both go; returns the bytes copied."""
    done = 0
    for view in views:
        n = min(view.nbytes, data.nbytes - done)
        if n <= 0:
            break
        view[:n] = data[done : done + n]
        done += n
    return done


def data_size(data: Data) -> int:
    return sum(b.nbytes for b in as_buffers(data))


def join_key(*parts: str) -> str:
    """Join key segments with ``/``, ignoring empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def hashed_key(key: str, *, width: int = 4) -> str:
    """``key`` under a short hash directory (``h-3fa2/step-00000100/__3_0.distcp``) spreading S3 partitions.

    S3 scales request rate per key prefix; every rank writing below ``step-00000100/`` shares one partition
    while it splits. The engine writes per-rank data at :meth:`Storage.data_key` (this key when the storage's
    ``hash_prefix`` is on) and must record the real key in the manifest (readers never recompute it).
    Retention finds stray hashed data by listing ``list_dirs("")`` entries that start with
    :data:`HASHED_DIR_PREFIX`.
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:width]
    return f"{HASHED_DIR_PREFIX}{digest}/{key}"


class Storage(abc.ABC):
    """Abstract storage: subclasses implement ``url`` and the five primitives below; the rest is derived."""

    # ---- capabilities ------------------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def url(self) -> str:
        """A URL naming this storage, for messages and manifests (``file:///abs/path``, ``s3://bucket/prefix``)."""

    @property
    def store_id(self) -> str:
        """Names the store and where it is reached (what a capability verdict is cached under): the URL, unless
        the same URL can name two stores (S3 adds its endpoint)."""
        return self.url

    @property
    def write_conditions(self) -> WriteConditions:
        """What this backend's create-only write and compare-and-swap are made of (messages, the probe)."""
        return WriteConditions(create="create-only write", swap="compare-and-swap")

    @property
    def writes_in_parts(self) -> bool:
        """True when large objects go up in parts that the store assembles (S3 multipart): the capability probe
        then checks the store completes such an upload (:meth:`put_parts`)."""
        return False

    def local_directory(self) -> LocalDirectory | None:
        """Its keys as files of this host (a POSIX directory), or None (an object store)."""
        return None

    @property
    def hash_prefix(self) -> bool:
        """True when per-rank data belongs under a short hash directory (:func:`hashed_key`; S3 partitions)."""
        return False

    @property
    def region(self) -> str | None:
        """Where the bytes live, for residency (S3: the bucket's region; POSIX: declared by the user, or None)."""
        return None

    def public_exposure(self) -> Exposure:
        """Whether anyone beyond the owner can read this storage. Raises StorageError when it cannot tell."""
        return Exposure(public=False, detail=f"{self.url} has no public endpoint")

    @property
    def read_batch_bytes(self) -> int:
        """Up to how many bytes of adjacent ranges a restore should read in one :meth:`readinto` (0: read each range
        on its own). Stores that charge per request (S3) want few large requests; a POSIX file is read fastest by
        several concurrent ``preadv`` calls."""
        return 0

    def data_key(self, key: str) -> str:
        """Where per-rank data named ``key`` goes: :func:`hashed_key` when ``hash_prefix`` is on, else ``key``."""
        return hashed_key(key) if self.hash_prefix else key

    # ---- primitives -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        """Write ``data`` (one buffer or a sequence of buffers, concatenated) at ``key``, atomically and durably.

        ``mode``: ``"overwrite"`` (default), ``"create"`` (create-only) or ``IfMatch(etag)`` (compare-and-swap).
        ``pacer``: called with the size of each piece before it is sent (together, the object's size).
        """

    @abc.abstractmethod
    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes (or to the end) of ``key`` from ``offset``."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and etag of ``key``; :class:`NotFoundError` when missing."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursive, in no particular order)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    # ---- derived (backends may override for speed) ------------------------------------------------------------
    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except NotFoundError:
            return False
        return True

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        """Upload a local file (``pacer`` as for :meth:`put`). S3 overrides this with a streaming multipart
        upload."""
        with open(path, "rb") as f:
            return self.put(key, f.read(), mode=mode, pacer=pacer)

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int:
        """Read bytes of ``key`` from ``offset`` into ``buffers`` (writable, filled in order) until they are full
        or the object ends; return how many bytes were read. :class:`NotFoundError` when missing.

        Restore reads ranges straight into their destination (a tensor's memory, a bounce buffer) with this.
        This default goes through :meth:`get`, so it costs one copy; backends override it to read without one
        (POSIX ``preadv``, S3 streaming the response body into the buffers).
        """
        views = as_buffers(buffers)
        total = sum(v.nbytes for v in views)
        if offset < 0:
            raise StorageError(f"invalid range offset={offset} on {key!r}", root=self.url)
        data = memoryview(self.get(key, offset=offset, length=total)) if total else None
        if data is None:
            self.head(key)  # a missing key still raises NotFoundError
            return 0
        return scatter(data, views)

    def copy_to(self, key: str, target: Storage, target_key: str, *, pacer: Pacer | None = None) -> ObjectInfo:
        """Copy the object ``key`` of this storage to ``target_key`` of ``target`` (an upload from the local tier to
        the durable one). ``pacer`` paces the write to ``target``. This default reads the object into memory;
        a backend with files streams from them (:meth:`put_file`)."""
        return target.put(target_key, self.get(key), pacer=pacer)

    def put_parts(self, key: str, parts: Sequence[bytes], *, mode: PutMode = "overwrite") -> ObjectInfo:
        """Write ``parts`` as one object assembled from parts when the backend :attr:`writes_in_parts` (whatever
        their size: the capability probe's check), else as one write of their concatenation."""
        return self.put(key, list(parts), mode=mode)

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Whole objects for several keys. Backends with latency override this with concurrent GETs."""
        return {k: self.get(k) for k in keys}

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The names one level below the directory ``prefix`` (whole segments; ``""`` is the root) under which
        objects are stored, sorted: ``step-00000100`` under the root. (contract, every backend and wrapper)

        It reads one level and never walks the tree below it: commit and retention call it on roots that hold
        every kept step's files. A key directly at ``prefix`` is not a name; nor is anything reached through a
        link. A name may be listed under which no object remains (a directory a crashed POSIX writer left empty):
        callers treat each name as a candidate, never as proof that something is there. A missing ``prefix`` lists
        nothing. This default filters :meth:`list` (a walk): backends override it with a one-level listing.
        """
        base = join_key(prefix)
        cut = len(base) + 1 if base else 0
        seen = set()
        for info in self.list(base + "/" if base else ""):
            rest = info.key[cut:]
            if "/" in rest:
                seen.add(rest.split("/", 1)[0])
        return sorted(seen)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many were removed."""
        base = join_key(prefix)
        keys = [i.key for i in self.list(base + "/" if base else "")]
        for k in keys:
            self.delete(k)
        return len(keys)

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing to release
        """Release clients and pools. Idempotent."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class ReadStore(Protocol):
    """What a restore reads through: whole small objects (``get``), sizes (``head``) and ranges straight into the
    caller's buffers (``readinto``), plus the two read-side capabilities it plans with. Restore is typed against
    this rather than :class:`Storage`, so a read-only or wrapped store needs only these to serve one; every
    :class:`Storage` is one."""

    @property
    def url(self) -> str: ...

    @property
    def read_batch_bytes(self) -> int: ...

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes: ...

    def head(self, key: str) -> ObjectInfo: ...

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int: ...
