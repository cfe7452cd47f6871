"""What a store actually honours, found out by trying it once per root: the capability probe.

The commit protocol rests on two conditional writes (create-only for the manifest, compare-and-swap for
``latest`` and the owner record); restore on ranged reads; large uploads, where a backend writes them in parts, on
the store assembling them. No protocol is a promise of any of them: some object stores ignore their conditional
headers (a second create-only write succeeds and replaces the object), some reject them, some have no
public-access or region API; a filesystem may refuse the hard links or the exclusive creates that a POSIX root's
conditional writes are made of. So every store is tried, whatever its backend: :func:`detect_capabilities` tries
each capability with sentinel objects under ``<root>/.ckptio-capabilities/<random>/`` and removes them before it
returns. The backend names its conditional writes (:attr:`~ckptio.storage.base.Storage.write_conditions`) so that a
verdict says what was tried.

Owns the probe and its verdict (:class:`StoreCapabilities`), and what each missing capability means for a
checkpoint (:func:`capability_problems`). It never decides to refuse: the Checkpointer, ``ckptio probe`` and
``ckptio admit`` do, from the verdict. It must never write outside its sentinel prefix, and it only reads the
placement APIs (region, public exposure), never changes them.

The verdict is cached per store (:attr:`~ckptio.storage.base.Storage.store_id`) in this process: a Checkpointer,
the probe and admit in one process pay for it once. Nothing is recorded under the root: a store that is upgraded
(or a root moved to another endpoint) is probed afresh by the next job, at the cost of about ten small requests.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ckptio.errors import AlreadyExistsError, PreconditionError, StorageError, StoreCapabilityError
from ckptio.storage.base import IfMatch, Storage, join_key

__all__ = [
    "ALL_CAPABILITIES",
    "COMPARE_AND_SWAP",
    "CONDITIONAL_CREATE",
    "MULTIPART",
    "PUBLIC_ACCESS_API",
    "RANGED_GET",
    "REGION_API",
    "Capability",
    "StoreCapabilities",
    "capability_problems",
    "detect_capabilities",
]

CONDITIONAL_CREATE = "conditional_create"
COMPARE_AND_SWAP = "compare_and_swap"
MULTIPART = "multipart"
RANGED_GET = "ranged_get"
PUBLIC_ACCESS_API = "public_access_api"
REGION_API = "region_api"
#: Every capability the probe reports, in the order it reports them.
ALL_CAPABILITIES = (CONDITIONAL_CREATE, COMPARE_AND_SWAP, MULTIPART, RANGED_GET, PUBLIC_ACCESS_API, REGION_API)

SENTINEL_DIR = ".ckptio-capabilities"
# A well-formed etag no object of the probe can have: the compare-and-swap must lose against it.
_WRONG_ETAG = "0" * 32
_CACHE: dict[str, StoreCapabilities] = {}
_CACHE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Capability:
    """One capability: present (``ok``), absent (``ok=False``) or not determinable (``ok=None``), and why."""

    name: str
    ok: bool | None
    detail: str


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """The probe's verdict on one store."""

    url: str
    checks: tuple[Capability, ...]

    def get(self, name: str) -> Capability:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return self.get(name).ok is True

    @property
    def present(self) -> frozenset[str]:
        return frozenset(c.name for c in self.checks if c.ok is True)

    @property
    def conditional_writes(self) -> bool:
        """Both conditional writes the commit protocol rests on are honoured."""
        return self.has(CONDITIONAL_CREATE) and self.has(COMPARE_AND_SWAP)

    def missing(self) -> list[Capability]:
        return [c for c in self.checks if c.ok is False]

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, **{c.name: {"ok": c.ok, "detail": c.detail} for c in self.checks}}


def capability_problems(caps: StoreCapabilities, *, commit: Literal["conditional", "lease"]) -> list[str]:
    """What each missing capability means for a checkpoint on this store, and the options (empty: none)."""
    problems = []
    if not caps.conditional_writes and commit == "conditional":
        lost = [c.detail for c in (caps.get(CONDITIONAL_CREATE), caps.get(COMPARE_AND_SWAP)) if c.ok is not True]
        problems.append(
            f"{caps.url} does not honour conditional writes ({'; '.join(lost)}). The commit rests on them: the "
            "manifest is written create-only and `latest` and the owner record move by compare-and-swap; without "
            "them two writers (two jobs, or a retried commit) can overwrite each other's manifest and both be told "
            "'committed'. Options: a store that honours both (`ckptio probe` checks yours), or commit=\"lease\" to "
            "rely on the ownership lease and a read-after-write check of the manifest instead (weaker: docs/s3.md, "
            "'Lease mode')"
        )
    if caps.get(MULTIPART).ok is False:
        problems.append(
            f"{caps.url} does not complete multipart uploads ({caps.get(MULTIPART).detail}): files above "
            "multipart_threshold cannot be written; raise storage_options={'multipart_threshold': ...} (up to "
            "5 GiB) and file_size_bytes below it, or use another store"
        )
    if caps.get(RANGED_GET).ok is False:
        problems.append(
            f"{caps.url} does not serve ranged reads ({caps.get(RANGED_GET).detail}): restore reads byte ranges "
            "of data files; this store cannot hold checkpoints"
        )
    return problems


def detect_capabilities(storage: Storage, *, refresh: bool = False) -> StoreCapabilities:
    """Probe ``storage`` (once per store and process unless ``refresh``); sentinel objects are removed."""
    key = storage.store_id
    with _CACHE_LOCK:
        cached = None if refresh else _CACHE.get(key)
    if cached is not None:
        return cached
    prefix = join_key(SENTINEL_DIR, secrets.token_hex(6))
    try:
        checks = (
            _probe_create(storage, join_key(prefix, "create")),
            _probe_swap(storage, join_key(prefix, "swap")),
            _probe_multipart(storage, join_key(prefix, "multipart")),
            _probe_range(storage, join_key(prefix, "range")),
            _probe_read(PUBLIC_ACCESS_API, lambda: storage.public_exposure().detail),
            _probe_read(REGION_API, lambda: f"region {storage.region or 'not declared'}"),
        )
    finally:
        with contextlib.suppress(StorageError):
            storage.delete_prefix(prefix)
    caps = StoreCapabilities(url=storage.url, checks=checks)
    with _CACHE_LOCK:
        _CACHE[key] = caps
    return caps


def _probe_create(storage: Storage, key: str) -> Capability:
    how = storage.write_conditions.create
    try:
        storage.put(key, b"first", mode="create")
    except StorageError as exc:
        storage.put(key, b"first")  # a store that cannot be written at all raises here, as it should
        return Capability(CONDITIONAL_CREATE, False, f"a create-only write ({how}) is rejected: {exc.message}")
    try:
        storage.put(key, b"second", mode="create")
    except AlreadyExistsError:
        if storage.get(key) != b"first":
            return Capability(CONDITIONAL_CREATE, False, "a create-only write on an existing key was refused "
                                                         "but replaced the object")
        return Capability(CONDITIONAL_CREATE, True, f"a create-only write ({how}) on an existing key is refused")
    except StorageError as exc:
        return Capability(CONDITIONAL_CREATE, False, f"a create-only write on an existing key failed with "
                                                     f"{exc.message} instead of a refusal")
    return Capability(CONDITIONAL_CREATE, False, f"a second create-only write ({how}) on an existing key "
                                                 "succeeded and replaced the object: the condition is ignored")


def _probe_swap(storage: Storage, key: str) -> Capability:
    how = storage.write_conditions.swap
    first = storage.put(key, b"v1")
    try:
        storage.put(key, b"v2", mode=IfMatch(_WRONG_ETAG))
    except PreconditionError:
        pass
    except StorageError as exc:
        return Capability(COMPARE_AND_SWAP, False, f"a compare-and-swap write ({how}) is rejected: {exc.message}")
    else:
        return Capability(COMPARE_AND_SWAP, False, f"a compare-and-swap ({how}) on a wrong etag succeeded: the "
                                                   "condition is ignored")
    try:
        storage.put(key, b"v3", mode=IfMatch(first.etag))
    except StorageError as exc:
        return Capability(COMPARE_AND_SWAP, False, f"a compare-and-swap ({how}) on the current etag lost "
                                                   f"({exc.message}): it can never succeed")
    return Capability(COMPARE_AND_SWAP, True, f"a compare-and-swap ({how}) on a wrong etag is refused, on the "
                                              "current one it succeeds")


def _probe_multipart(storage: Storage, key: str) -> Capability:
    if not storage.writes_in_parts:
        return Capability(MULTIPART, True, "not used by this backend (every object is one write)")
    payload = secrets.token_bytes(64)
    try:
        storage.put_parts(key, [payload])
        body = storage.get(key)
    except StorageError as exc:
        return Capability(MULTIPART, False, f"a multipart upload failed: {exc.message}")
    if body != payload:
        return Capability(MULTIPART, False, "a completed multipart upload reads back different bytes")
    return Capability(MULTIPART, True, "an object written in parts reads back intact")


def _probe_range(storage: Storage, key: str) -> Capability:
    payload = bytes(range(64))
    storage.put(key, payload)
    try:
        got = storage.get(key, offset=10, length=7)
    except StorageError as exc:
        return Capability(RANGED_GET, False, f"a ranged read failed: {exc.message}")
    if got != payload[10:17]:
        return Capability(RANGED_GET, False, f"a read of 7 bytes at offset 10 returned {len(got)} bytes: the range "
                                             "is ignored")
    return Capability(RANGED_GET, True, "a read of 7 bytes at offset 10 returns exactly those")


def _probe_read(name: str, read: Callable[[], str]) -> Capability:
    try:
        return Capability(name, True, read())
    except StoreCapabilityError as exc:
        return Capability(name, False, exc.message)
    except StorageError as exc:
        return Capability(name, None, f"could not tell: {exc.message}")
