"""One job per checkpoint root: an owner record with a heartbeat.

Two jobs saving into one root would interleave steps and let one job's retention delete the other's checkpoints.
At start, rank 0 claims ``<root>/.ckptio-owner.json``; the claim fails with :class:`RootInUseError` while another
job's record is fresh (heartbeat newer than its lease) and, when that job ran on this host, its process is alive.
A job killed with -9 therefore frees the root at once on the same host, and after one lease elsewhere.
Rank 0's writer refreshes the heartbeat; ``close()`` releases the claim.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass

from ckptio._proc import pid_alive
from ckptio.errors import AlreadyExistsError, NotFoundError, PreconditionError, RootInUseError, StorageError
from ckptio.storage.base import IfMatch, Storage

OWNER_KEY = ".ckptio-owner.json"


@dataclass(kw_only=True, slots=True)
class OwnerRecord:
    """Who holds a root, and until when the claim stands without a heartbeat."""

    job_id: str
    host: str
    pid: int
    heartbeat: float
    lease_s: float

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


def _alive_here(record: OwnerRecord) -> bool:
    if record.host != socket.gethostname():
        return True  # cannot tell for another host: trust the lease
    return pid_alive(record.pid)


def _holds(record: OwnerRecord, now: float) -> bool:
    return now - record.heartbeat < record.lease_s and _alive_here(record)


def read_owner(storage: Storage) -> tuple[OwnerRecord | None, str | None]:
    try:
        info = storage.head(OWNER_KEY)
        raw = storage.get(OWNER_KEY)
    except NotFoundError:
        return None, None
    try:
        return OwnerRecord(**json.loads(raw)), info.etag
    except (ValueError, TypeError):
        return None, info.etag  # unreadable record: treat as free, but replace it with CAS


def claim_root(storage: Storage, *, lease_s: float, job_id: str | None = None) -> OwnerRecord:
    """Take the root for this job, or raise RootInUseError naming the holder."""
    mine = OwnerRecord(job_id=job_id or uuid.uuid4().hex, host=socket.gethostname(), pid=os.getpid(),
                       heartbeat=time.time(), lease_s=lease_s)
    for _ in range(5):
        current, etag = read_owner(storage)
        if current is not None and current.job_id != mine.job_id and _holds(current, time.time()):
            raise RootInUseError(
                f"another job ({current.job_id} on {current.host}, pid {current.pid}) owns this root; its lease "
                f"ends {current.lease_s - (time.time() - current.heartbeat):.0f} s after its last heartbeat",
                root=storage.url,
            )
        try:
            if etag is None:
                storage.put(OWNER_KEY, mine.to_json(), mode="create")
            else:
                storage.put(OWNER_KEY, mine.to_json(), mode=IfMatch(etag))
            return mine
        except (AlreadyExistsError, PreconditionError):
            continue  # someone else moved first: look again
    raise RootInUseError("could not claim the root: it keeps changing hands", root=storage.url)


def heartbeat(storage: Storage, record: OwnerRecord) -> None:
    """Refresh the claim (called by rank 0's writer); a failure is retried at the next beat."""
    record.heartbeat = time.time()
    try:
        storage.put(OWNER_KEY, record.to_json())
    except StorageError:
        pass


def release_root(storage: Storage, record: OwnerRecord) -> None:
    current, _ = read_owner(storage)
    if current is not None and current.job_id == record.job_id:
        try:
            storage.delete(OWNER_KEY)
        except StorageError:
            pass
