"""Every message between a trainer and its writer process, and the writer's thread-safe sending end.

Trainer → writer, in this order over one pipe: :class:`WriterStart` once, then :class:`WriterPlan` whenever the
state's structure changes, :class:`SaveJob` per save (and :class:`WriterHurry` when a paced flush must finish at
once), and :class:`WriterStop` at close. A save of a step at or below
one this trainer already saved or restored is bracketed by :class:`SaveReserve` (answered by :class:`Reserved`)
and :class:`SaveRelease`, so that no cleanup deletes the step's directory while any rank may be writing it.
Writer → trainer: :class:`WriterEvent` (an event record for the trainer's log), :class:`SlotFree` (the staging
slot may be reused), then exactly one of :class:`SaveDone` / :class:`SaveFailed` / :class:`SaveDropped` per job, and
:class:`WriterStopped` last. Replies name the save by ``save_id`` (one step may be saved twice).

Messages are frozen: the receiver never writes into what it was sent. Both ends dispatch with ``match`` on these
classes. This module owns the message shapes only; it must never decide anything about a save.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ckptio.config import WriterConfig
from ckptio.engine.owner_record import OwnerRecord
from ckptio.format.layout import RankLayout
from ckptio.obs.events import Event, make_record
from ckptio.storage.base import Storage

# ---- trainer → writer ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriterStart:
    """The first message: the writer's config plus what only the running trainer knows."""

    config: WriterConfig
    rank: int
    world_size: int
    durable: Storage
    local: Storage | None
    owner: OwnerRecord | None
    """Rank 0 only: the root's owner record, whose heartbeat the writer keeps fresh."""
    levels: LevelsStart | None = None
    """The local level (None with ``durable_every=1``: every save goes to the durable level only)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """One rank's partner server: where the local level's copies of its node go, and where a restore fetches."""

    rank: int
    node: str
    """The node the rank runs on (``node_id``, else the host name and torchrun's ``GROUP_RANK``)."""
    host: str
    """The address its partner server listens on (``CKPTIO_PARTNER_HOST``, else this host's address)."""
    port: int


@dataclass(frozen=True, slots=True)
class LevelsStart:
    """What a writer needs for the local level (partner replication, local-level commits)."""

    node: str
    listen_fd: int
    """The partner server's listening socket, bound by the trainer (so its address outlives a writer restart)."""
    peers: tuple[Peer, ...]
    """Every rank's partner server, ordered by rank."""
    partner_ranks: tuple[int, ...]
    """The ranks (on other nodes) that receive a copy of this rank's files."""
    timeout_s: float
    """A partner that does not take a file within this many seconds is unreachable for that save."""
    secret: bytes = field(repr=False)
    """The job's partner secret (agreed over the side group at construction; only ever in memory and on this
    pipe): every partner connection proves it (engine.partner.auth). Kept out of repr so no log shows it."""


@dataclass(frozen=True, slots=True)
class JobLevels:
    """Which levels one save goes to: the durable root, the local level (own node + partners), or both."""

    durable: bool = True
    local: bool = False

    @property
    def reporting(self) -> str:
        """The level whose outcome is the save's outcome: durable when the save goes there, else local."""
        return "durable" if self.durable else "local"


@dataclass(frozen=True, slots=True)
class WriterPlan:
    """A rank's plan, sent once per state structure instead of with every job."""

    plan_id: int
    layout: RankLayout
    metadata_skeleton: bytes | None
    """Pickled DCP Metadata without storage_data (rank 0 only)."""


@dataclass(frozen=True, slots=True)
class Rollback:
    """The trainer restored ``above``: committed steps above it that this run did not save are retired."""

    above: int
    own_save_ids: tuple[int, ...]
    """Save ids this trainer submitted since the restore (their commits belong to the new trajectory)."""


@dataclass(frozen=True, slots=True)
class SaveJob:
    """One save of one rank; the snapshot itself stays in the shared-memory slot."""

    step: int
    save_id: int
    slot_id: int
    slot_path: str
    slot_nbytes: int
    plan_id: int
    """The :class:`WriterPlan` this job's slot follows (the writer looks it up)."""
    objects: tuple[bytes, ...]
    """The non-tensor items, pickled, in the plan's object order."""
    rollback: Rollback | None = None
    """Until a save after a restore commits: retire the abandoned trajectory's later steps."""
    replaces: tuple[int, ...] = ()
    """Save ids of this trainer's earlier saves of this step: their manifest is superseded, any other refused."""
    levels: JobLevels = JobLevels()
    """Where this save goes (the ``durable_every`` schedule, or an emergency save's local level)."""
    pace_bytes_per_s: float | None = None
    """The rate of this save's durable flush (``engine.trainer.pace_rule``); None: full speed."""


@dataclass(frozen=True, slots=True)
class SaveReserve:
    """A save of ``step`` is about to be agreed: keep cleanup away from that step until :class:`SaveRelease`."""

    step: int


@dataclass(frozen=True, slots=True)
class SaveRelease:
    """Ends the matching :class:`SaveReserve` (the :class:`SaveJob`, if any, holds the step by itself)."""

    step: int


@dataclass(frozen=True, slots=True)
class WriterHurry:
    """The flush in progress goes to full speed: a save waits for its slot, or ``close()`` waits for the saves."""


@dataclass(frozen=True, slots=True)
class WriterStop:
    """Finish the queue, then exit."""


# ---- writer → trainer ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriterEvent:
    record: dict[str, Any]
    """A record built by :func:`ckptio.obs.events.make_record` in the writer, for the trainer's event log."""


@dataclass(frozen=True, slots=True)
class Reserved:
    """Answer to :class:`SaveReserve`: no cleanup touches ``step`` from now on."""

    step: int


@dataclass(frozen=True, slots=True)
class SlotFree:
    """The writer no longer reads staging slot ``slot_id`` for the save ``save_id`` of ``step``."""

    step: int
    save_id: int
    slot_id: int


@dataclass(frozen=True, slots=True)
class CommitInfo:
    total_bytes: int
    files: int


@dataclass(frozen=True, slots=True)
class SaveDone:
    """``step`` is committed (this rank saw the manifest of its own save ``save_id``)."""

    step: int
    save_id: int
    info: CommitInfo


@dataclass(frozen=True, slots=True)
class SaveFailed:
    step: int
    save_id: int
    error: BaseException
    """Always a :class:`~ckptio.errors.CkptError` (the writer wraps anything else)."""


@dataclass(frozen=True, slots=True)
class SaveDropped:
    """The save ``save_id`` of ``step`` was given up on every rank (a rank had no free staging slot or refused the
    save): nothing of it commits, and the trainer reports it as skipped."""

    step: int
    save_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class WriterStopped:
    """The last message of a writer that stopped when asked (a death sends nothing)."""


ToWriter = WriterStart | WriterPlan | SaveJob | SaveReserve | SaveRelease | WriterHurry | WriterStop
FromWriter = WriterEvent | Reserved | SlotFree | SaveDone | SaveFailed | SaveDropped | WriterStopped


class Outbox:
    """The writer's thread-safe sending end (the job pipeline and the committer thread share it)."""

    def __init__(self, conn: Connection, rank: int) -> None:
        self.conn, self.rank = conn, rank
        self.lock = threading.Lock()

    def send(self, msg: FromWriter) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (BrokenPipeError, OSError):
                pass  # the trainer is gone; nothing left to tell

    def event(self, event: Event, step: int | None = None, **fields: Any) -> None:
        self.send(WriterEvent(make_record(event, step, rank=self.rank, role="writer", **fields)))
