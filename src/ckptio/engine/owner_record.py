"""One job per checkpoint root: an owner record with a heartbeat, renewed by compare-and-swap.

Two jobs saving into one root would interleave steps and let one job's retention delete the other's checkpoints.
At start, rank 0 claims ``<root>/.ckptio-owner.json``; the claim fails with :class:`RootInUseError` while another
job's record is fresh (heartbeat newer than its lease) and, when that job ran on this machine, its process is alive.
A job killed with -9 therefore frees the root at once on the same machine, and after one lease elsewhere. "This
machine" is :func:`ckptio._proc.machine_id` (boot id and pid namespace), not the hostname: two nodes or containers
may share a name, and a pid means nothing across them. (A record written without it is judged by hostname.)

The claim and every renewal are conditional writes of the storage (create-only, compare-and-swap), so of two jobs
claiming one root at once exactly one wins, also from two clients of a shared filesystem: the POSIX backend builds
both on ``link()`` and ``O_EXCL`` lock files, which the filesystem's server decides for every client
(:mod:`ckptio.storage.posix.exclusion`), never on ``flock``.

Rank 0's writer renews the heartbeat with ``put(mode=IfMatch(etag))`` — never an unconditional overwrite — so an
owner that was paused past its lease (SIGSTOP, a frozen VM, a long GC) and was replaced finds out on its next
beat: the swap loses, the record is marked lost, and :func:`ensure_lease` (called by the committer right before a
manifest is written) raises ``RootInUseError``; that job never commits into the root again. ``close()`` releases
the claim only while the record is still this claim's.

A record that names a heartbeat in the future (beyond :data:`MAX_CLOCK_SKEW_S`) or a lease that is not in
``[0, MAX_LEASE_S]`` is refused with a ``RootInUseError`` that says what is wrong and how to clear it, instead of
locking the root for years. A file that is not an owner record at all (not JSON, wrong fields) is treated as free
and replaced by compare-and-swap.

This module must never write anything but the owner record.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ckptio._proc import machine_id, pid_alive
from ckptio.errors import (
    AlreadyExistsError,
    ConfigError,
    NotFoundError,
    PreconditionError,
    RootInUseError,
    StorageError,
)
from ckptio.storage.base import IfMatch, Storage, join_key

OWNER_KEY = ".ckptio-owner.json"
#: Longest lease a record may ask for; a longer one is a mistake or a forgery, not a job.
MAX_LEASE_S = 86400.0
#: How far in the future a heartbeat may lie (clocks of two hosts disagree) before the record is refused.
MAX_CLOCK_SKEW_S = 120.0

# The heartbeat thread and the committer thread of one writer may both renew: serialise the swaps.
_RENEW_LOCK = threading.Lock()
_MACHINE = machine_id()


@dataclass(kw_only=True, slots=True)
class OwnerRecord:
    """Who holds a root, and until when the claim stands without a heartbeat.

    ``claim`` is unique per claim (a restarted job with the same ``job_id`` gets a new one), so an owner can tell
    its own record from its successor's. ``machine`` says where ``pid`` can be checked. The fields after it are
    this process's view of its claim; they are never written to the store.
    """

    job_id: str
    host: str
    pid: int
    heartbeat: float
    lease_s: float
    claim: str = ""
    machine: str = ""
    etag: str = field(default="", compare=False)
    """The record's etag after this claim's last successful write (the If-Match of the next renewal)."""
    renewed_at: float = field(default=0.0, compare=False)
    """``time.monotonic()`` of the last successful write by this process."""
    lost: str = field(default="", compare=False)
    """Why the lease is lost (empty while held)."""

    def to_json(self) -> bytes:
        return json.dumps({"job_id": self.job_id, "host": self.host, "pid": self.pid, "heartbeat": self.heartbeat,
                           "lease_s": self.lease_s, "claim": self.claim, "machine": self.machine}).encode()


def _parse(raw: bytes) -> OwnerRecord | None:
    """The record in ``raw``, or None when it is not an owner record at all."""
    try:
        doc: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    try:
        job_id, host, pid = doc["job_id"], doc["host"], doc["pid"]
        heartbeat, lease_s, claim = doc["heartbeat"], doc["lease_s"], doc.get("claim", "")
        machine = doc.get("machine", "")
    except KeyError:
        return None
    if not all(isinstance(v, str) for v in (job_id, host, claim, machine)):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (pid, heartbeat, lease_s)):
        return None
    return OwnerRecord(job_id=job_id, host=host, pid=int(pid), heartbeat=float(heartbeat), lease_s=float(lease_s),
                       claim=claim, machine=machine)


def read_owner(storage: Storage) -> tuple[OwnerRecord | None, str | None]:
    """The current record and its etag; ``(None, etag)`` for a file that is not a record, ``(None, None)`` if none."""
    try:
        info = storage.head(OWNER_KEY)
        raw = storage.get(OWNER_KEY)
    except NotFoundError:
        return None, None
    return _parse(raw), info.etag


def _on_this_machine(record: OwnerRecord) -> bool:
    """Whether ``record.pid`` names a process this one can check."""
    if record.machine:
        return record.machine == _MACHINE
    return record.host == socket.gethostname()  # an older record: its hostname is all there is


def _alive_here(record: OwnerRecord) -> bool:
    if not _on_this_machine(record):
        return True  # cannot tell for another machine: trust the lease
    return record.pid > 0 and pid_alive(record.pid)


def _implausible(record: OwnerRecord, now: float) -> str | None:
    """What makes a record impossible to honour as written, or None when it is plausible."""
    if not math.isfinite(record.lease_s) or not 0 <= record.lease_s <= MAX_LEASE_S:
        return f"its lease_s is {record.lease_s!r} (a lease must lie between 0 and {MAX_LEASE_S:.0f} s)"
    if not math.isfinite(record.heartbeat):
        return f"its heartbeat is {record.heartbeat!r}"
    if record.heartbeat - now > MAX_CLOCK_SKEW_S:
        return (f"its heartbeat lies {record.heartbeat - now:.0f} s in the future (more than the "
                f"{MAX_CLOCK_SKEW_S:.0f} s of clock skew allowed)")
    return None


def _holds(storage: Storage, record: OwnerRecord, now: float) -> bool:
    """Whether ``record`` still holds the root; RootInUseError when the record cannot be judged."""
    if _on_this_machine(record) and not _alive_here(record):
        return False  # its process is gone: whatever the record says, nobody holds the root
    problem = _implausible(record, now)
    if problem is not None:
        raise RootInUseError(
            f"the owner record {join_key(storage.url, OWNER_KEY)} (job {record.job_id!r} on {record.host}, "
            f"pid {record.pid}) cannot be honoured: {problem}. If no other job uses this root, delete that file, "
            f"or pass job_id={record.job_id!r} to take the root over",
            root=storage.url, path=OWNER_KEY,
        )
    return now - record.heartbeat < record.lease_s and _alive_here(record)


def _check_lease_s(lease_s: float) -> None:
    if not isinstance(lease_s, (int, float)) or isinstance(lease_s, bool) or not math.isfinite(lease_s) \
            or not 0 < lease_s <= MAX_LEASE_S:
        raise ConfigError(f"lease_s must be a number of seconds in (0, {MAX_LEASE_S:.0f}], got {lease_s!r}")


def claim_root(storage: Storage, *, lease_s: float, job_id: str | None = None) -> OwnerRecord:
    """Take the root for this job, or raise RootInUseError naming the holder (and how to clear a bad record)."""
    _check_lease_s(lease_s)
    mine = OwnerRecord(job_id=job_id or uuid.uuid4().hex, host=socket.gethostname(), pid=os.getpid(),
                       heartbeat=time.time(), lease_s=float(lease_s), claim=uuid.uuid4().hex, machine=_MACHINE)
    for _ in range(5):
        current, etag = read_owner(storage)
        now = time.time()
        if current is not None and current.job_id != mine.job_id and _holds(storage, current, now):
            raise RootInUseError(
                f"another job ({current.job_id} on {current.host}, pid {current.pid}) owns this root; its lease "
                f"ends {current.lease_s - (now - current.heartbeat):.0f} s after its last heartbeat",
                root=storage.url,
            )
        mine.heartbeat, sent = time.time(), time.monotonic()
        try:
            info = storage.put(OWNER_KEY, mine.to_json(), mode="create" if etag is None else IfMatch(etag))
        except (AlreadyExistsError, PreconditionError, NotFoundError):
            continue  # someone else moved first: look again
        mine.etag, mine.renewed_at = info.etag, sent
        return mine
    raise RootInUseError("could not claim the root: it keeps changing hands", root=storage.url)


def _lose(storage: Storage, record: OwnerRecord, why: str) -> RootInUseError:
    record.lost = why
    return RootInUseError(f"this job lost its claim on the root: {why}; it stops saving here", root=storage.url)


def _renew(storage: Storage, record: OwnerRecord) -> None:
    """One compare-and-swap renewal; raises RootInUseError once the record belongs to someone else."""
    if record.lost:
        raise RootInUseError(f"this job lost its claim on the root: {record.lost}", root=storage.url)
    # The lease runs from the heartbeat written, not from the answer: a process paused while its write was in
    # flight reads a success that a successor may already have overwritten (see ensure_lease).
    beat, sent = time.time(), time.monotonic()
    body = OwnerRecord(job_id=record.job_id, host=record.host, pid=record.pid, heartbeat=beat,
                       lease_s=record.lease_s, claim=record.claim, machine=record.machine).to_json()
    try:
        info = storage.put(OWNER_KEY, body, mode=IfMatch(record.etag))
    except (PreconditionError, NotFoundError):
        current, etag = read_owner(storage)
        if current is not None and current.claim == record.claim and etag is not None:
            record.etag = etag  # our own write whose answer was lost: adopt it and swap again next beat
            return
        if current is None and etag is None:
            # The record was deleted (by hand, as an error message suggests): take it back only if still free.
            try:
                info = storage.put(OWNER_KEY, body, mode="create")
            except AlreadyExistsError:
                raise _lose(storage, record, "the owner record was replaced after it was deleted") from None
        else:
            holder = f"job {current.job_id!r} on {current.host}" if current is not None else "an unreadable record"
            raise _lose(storage, record, f"{holder} took it over after this job's heartbeat lapsed") from None
    record.heartbeat, record.etag, record.renewed_at = beat, info.etag, sent


def heartbeat(storage: Storage, record: OwnerRecord) -> None:
    """Renew the claim (rank 0's writer, every lease/3). A storage failure is retried at the next beat; a lost
    claim raises RootInUseError and stays lost."""
    with _RENEW_LOCK:
        try:
            _renew(storage, record)
        except RootInUseError:
            raise
        except StorageError:
            pass  # transient: the next beat (or ensure_lease before a commit) tries again


def ensure_lease(storage: Storage, record: OwnerRecord | None) -> None:
    """Raise RootInUseError unless this process still holds the root; called right before a manifest is written.

    When the last successful renewal is older than half the lease (the process was paused, or beats failed), it
    renews now, so a job that resumes after losing its lease cannot commit in the moment before its heartbeat
    thread notices.
    """
    if record is None:
        return
    with _RENEW_LOCK:
        if record.lost:
            raise RootInUseError(f"this job lost its claim on the root: {record.lost}", root=storage.url)
        if time.monotonic() - record.renewed_at > record.lease_s / 2:
            _renew(storage, record)


def release_root(storage: Storage, record: OwnerRecord) -> None:
    """Delete the owner record, only while it is still this claim's (never a successor's)."""
    try:
        current, _ = read_owner(storage)
    except StorageError:
        return
    if current is not None and current.claim == record.claim:
        try:
            storage.delete(OWNER_KEY)
        except StorageError:
            pass
