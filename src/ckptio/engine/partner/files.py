"""Files on both ends of a partner transfer: stream with a hash, land atomically, clean up what was abandoned.

Receiving goes to a temporary file next to the destination, hashed chunk by chunk, and is renamed into place only
when the caller's check passes; any failure removes the temporary file. Temporary names carry the owning process
(``.tmp-p<pid>-<token>-<name>``), which the storage's listings already skip, so a half-received copy is never
taken for a file. One chunk buffer per transfer: no file is ever held in memory whole.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable, Collection

import crc32c

from ckptio.engine.partner.auth import recv_exact, send_all
from ckptio.engine.partner.digest import CHUNK, finish, new_hasher
from ckptio.errors import ReplicationError
from ckptio.storage.base import Pacer
from ckptio.storage.posix.posix_storage import TMP_PREFIX

_SENDFILE_PIECE = 8 * CHUNK


def temp_path(final: str) -> str:
    directory, name = os.path.split(final)
    return os.path.join(directory, f"{TMP_PREFIX}p{os.getpid()}-{secrets.token_hex(4)}-{name}")


def own_temp(name: str) -> bool:
    """Is ``name`` a temporary file of this process?"""
    return name.startswith(f"{TMP_PREFIX}p{os.getpid()}-")


def receive_to_file(sock: socket.socket, final: str, size: int, *, deadline: float, idle_s: float,
                    accept: Callable[[str, str], bool], active: set[str] | None = None) -> bool:
    """Receive ``size`` bytes from ``sock`` into ``final``: hashed while written, renamed into place only when
    ``accept(digest, crc32c_hex)`` is true (it may read more from the socket, e.g. a trailer). Returns whether the
    file was kept; on any failure or refusal the temporary file is gone. ``active`` (a server's set of temp files
    in flight) holds the temp path while it exists, so a sweep never removes a live transfer's file."""
    os.makedirs(os.path.dirname(final), exist_ok=True)
    tmp, kept = temp_path(final), False
    if active is not None:
        active.add(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        hasher, value = new_hasher(), 0
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        with open(fd, "wb") as f:
            left = size
            while left:
                k = min(left, CHUNK)
                recv_exact(sock, k, deadline, idle_s=idle_s, into=view)
                hasher.update(view[:k])
                value = crc32c.crc32c(view[:k], value)
                f.write(view[:k])
                left -= k
        if accept(finish(hasher), f"{value:08x}"):
            os.replace(tmp, final)
            kept = True
        return kept
    finally:
        if not kept:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if active is not None:
            active.discard(tmp)


def send_hashed(sock: socket.socket, path: str, size: int, crc: str, *, deadline: float, idle_s: float,
                hash_it: bool, pacer: Pacer | None = None) -> str | None:
    """Send the first ``size`` bytes of ``path``, read in chunks (each after ``pacer`` lets it go, when paced);
    returns their digest (None unless ``hash_it``).
    ReplicationError when the file no longer matches its size or crc32c: the digest recorded for the partner
    copy must be the digest of the bytes the rank index describes, never of a file damaged after it was written."""
    hasher, value, left = new_hasher() if hash_it else None, 0, size
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while left:
            k = f.readinto(view[:min(CHUNK, left)])
            if not k:
                raise ReplicationError(f"{path}: shorter than its recorded {size} bytes")
            chunk = view[:k]
            value = crc32c.crc32c(chunk, value)
            if hasher is not None:
                hasher.update(chunk)
            if pacer is not None:
                pacer.take(k)
            send_all(sock, chunk, deadline, idle_s=idle_s)
            left -= k
    if f"{value:08x}" != crc:
        raise ReplicationError(f"{path}: crc32c {value:08x} read back, {crc} recorded: not sent")
    return finish(hasher) if hasher is not None else None


def send_file(sock: socket.socket, fd: int, size: int, *, deadline: float, idle_s: float) -> None:
    """Send ``size`` bytes of the open file ``fd`` with ``sendfile`` (no user-space copy, nothing held in
    memory): a peer that stops reading stalls this thread until ``idle_s`` or ``deadline``, never grows memory."""
    offset = 0
    with open(fd, "rb", closefd=False) as f:
        while offset < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("transfer deadline passed")
            sock.settimeout(min(left, idle_s))
            sent = sock.sendfile(f, offset, min(_SENDFILE_PIECE, size - offset))
            if sent == 0:
                raise ConnectionError("file shrank while being served")
            offset += sent


def remove_abandoned_temps(directories: list[str], *, stale_s: float, active: Collection[str] = (),
                           own_too: bool = False) -> int:
    """Remove temporary files in ``directories`` that no transfer is writing: any untouched for ``stale_s`` (a
    live transfer writes more often, or is dropped and deletes its own), and with ``own_too`` this process's own
    that are not ``active`` (at close, when its transfers are over). Returns how many were removed."""
    removed, now = 0, time.time()
    for directory in directories:
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.startswith(TMP_PREFIX) or entry.path in active:
                    continue
                with contextlib.suppress(OSError):
                    if (own_too and own_temp(entry.name)) or now - entry.stat(follow_symlinks=False).st_mtime > stale_s:
                        os.unlink(entry.path)
                        removed += 1
    return removed
