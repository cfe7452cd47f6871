"""Cryptographic digests of partner copies: what a copy that crossed the network must match before it is used.

A digest is the string ``sha256:<64 hex digits>``. The sender computes it while it streams a file to a partner,
records it in its local rank index on the durable root (where a network attacker cannot write), and the restore
path uses a partner copy only when its bytes hash to that record. crc32c (the rank index's checksum) catches
accidents; anyone can recompute it for forged bytes, which is why copies from the network need this digest.

SHA-256 rather than BLAKE2b: CPUs with SHA extensions (current x86 and ARM servers) hash SHA-256 faster than
CPython's BLAKE2b, and the writer pays the hash once per copied byte (bench/bench_partner_digest.py). Files are
read in fixed chunks into one reused buffer, so hashing never holds a file in memory. No sockets here.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import TYPE_CHECKING, Protocol

from ckptio.errors import ChecksumError
from ckptio.format.records import DIGEST_PREFIX

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

CHUNK = 1 << 20
"""Read and send unit: large enough that per-call overhead vanishes, small enough to bound memory per transfer."""


class Hasher(Protocol):
    """What a digest is computed with: bytes in, chunk by chunk, then the hex digest (hashlib's hash objects)."""

    def update(self, data: ReadableBuffer, /) -> None: ...

    def hexdigest(self) -> str: ...


def new_hasher() -> Hasher:
    """A fresh hash object of the digest algorithm (``update`` per chunk, then :func:`finish`)."""
    return hashlib.sha256()


def finish(hasher: Hasher) -> str:
    return DIGEST_PREFIX + hasher.hexdigest()


def bytes_digest(data: bytes | memoryview) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def file_digest(path: str) -> str:
    """The digest of the file at ``path``, read in :data:`CHUNK` pieces."""
    hasher, buf = new_hasher(), bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(buf):
            hasher.update(view[:k])
    return finish(hasher)


def digests_equal(actual: str, expected: str) -> bool:
    """Constant-time comparison: a refusal must not tell a prober how many leading characters were right."""
    return hmac.compare_digest(actual.encode(), expected.encode())


def check_digest(actual: str, expected: str | None, *, what: str, step: int | None = None,
                 path: str | None = None) -> None:
    """Raise ChecksumError unless ``actual`` equals the recorded ``expected``. A missing record (a step saved
    before digests were recorded) is a refusal too: an unrecorded copy from the network cannot be authenticated."""
    if expected is None:
        raise ChecksumError(f"{what}: no digest recorded for this copy (saved before partner digests existed): "
                            "not used", step=step, path=path)
    if not digests_equal(actual, expected):
        raise ChecksumError(f"{what}: digest {actual} does not match the recorded {expected}", step=step, path=path)


def verify_file_digest(path: str, expected: str | None, *, step: int | None = None) -> None:
    """Raise ChecksumError unless the file at ``path`` hashes to ``expected``."""
    check_digest(file_digest(path), expected, what=os.path.basename(path), step=step, path=path)
