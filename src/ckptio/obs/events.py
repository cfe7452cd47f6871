"""JSONL events: the one record of what every save did, on every rank, in the trainer and in the writer.

Metrics (``obs.metrics``) and the report (``obs.report``) are both computed from these events, so the event schema
below is a contract. Each line is one JSON object with at least::

    ts     wall-clock seconds (time.time())
    mono   CLOCK_MONOTONIC seconds (time.monotonic(); comparable across processes of one host)
    rank   global rank
    role   "trainer" | "writer" | "committer"
    event  one of Event (the enum below; EVENTS holds the same names as plain strings)
    step   the checkpoint (or training) step, or null

Events and their extra fields:

    save_requested   step                       save() called
    save_agreed      step, blocked_s, pending   the save goes ahead on this rank: its slot is free (a steady save
                                                decides alone; the first save and a structure change agree with
                                                every rank). blocked_s: waiting for the slot (overflow=block)
    save_skipped     step, reason, pending      not saved: this rank had no free slot (overflow="skip", a drop
                                                marker tells the others), or the step was dropped for another rank
    stage_begin      step
    stage_end        step, bytes, seconds       tensors copied into the staging slot
    save_returned    step, blocking_s, bytes    save() returned to the training loop (blocking_s: whole call)
    phase            step, phase, seconds, bytes, tier
                     phase ∈ Phase: serialize | local_write | upload | rank_index | metadata | manifest | retention
                     tier ∈ local | durable
    retry            step, op, attempt, error
    save_failed      step, error, error_type
    committed        step, flush_s, bytes, lag_s, interval_s
                     flush_s: save() return → commit seen by this rank; lag_s: commit time − save request time;
                     interval_s: time since the previous staged (not skipped) save request (null for the first)
    queue            pending                    staged snapshots not yet flushed
    step_begin       step                       a training step started (StepTimer / ck.step_begin)
    step_end         step, seconds              a training step ended
    writer_started   pid
    writer_died      pid, exitcode
    local_tier_full  step, error                a warning: no room on the local tier even after eviction; the
                                                save was written to the durable tier only
    steps_retired    step, restored_step, retired   after a restore, the abandoned trajectory's steps were retired
    commit_behind    step, level, waited_s, unfinished   back-pressure: the writer held this save's files back
                                                until its level's committer was no more than max_pending behind

Writers also append to the same log; a file per rank keeps appends from interleaving across processes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    from enum import Enum

    class StrEnum(str, Enum):
        """A str whose members print and format as their value (what ``enum.StrEnum`` does from 3.11)."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


class Event(StrEnum):
    """The ``event`` field of a record. Members are str: they compare, hash and serialize as their value."""

    SAVE_REQUESTED = "save_requested"
    SAVE_AGREED = "save_agreed"
    SAVE_SKIPPED = "save_skipped"
    STAGE_BEGIN = "stage_begin"
    STAGE_END = "stage_end"
    SAVE_RETURNED = "save_returned"
    PHASE = "phase"
    RETRY = "retry"
    SAVE_FAILED = "save_failed"
    COMMITTED = "committed"
    QUEUE = "queue"
    STEP_BEGIN = "step_begin"
    STEP_END = "step_end"
    WRITER_STARTED = "writer_started"
    WRITER_DIED = "writer_died"
    LOCAL_TIER_FULL = "local_tier_full"  # a warning: the local tier had no room even after eviction; durable only
    STEPS_RETIRED = "steps_retired"  # after a restore, the abandoned trajectory's later steps were retired
    COMMIT_BEHIND = "commit_behind"  # back-pressure: a save waited for its level's committer to catch up
    FLUSH_PACED = "flush_paced"  # how a paced flush went: target and achieved rate, how long the pace stretched it
    # The local level (node-local + partner copies), restores from it, preemption.
    LEVEL_COMMITTED = "level_committed"
    LEVEL_FAILED = "level_failed"
    REPLICA_FAILED = "replica_failed"  # a partner took no copy of a local-level save: it commits with fewer holders
    RESTORED = "restored"
    PREEMPTED = "preempted"


class Phase(StrEnum):
    """The ``phase`` field of a ``phase`` event: one stage of a flush, in the order a save runs them."""

    SERIALIZE = "serialize"
    LOCAL_WRITE = "local_write"
    REPLICATE = "replicate"  # copies to partner nodes (the local level)
    UPLOAD = "upload"
    RANK_INDEX = "rank_index"
    METADATA = "metadata"
    MANIFEST = "manifest"
    RETENTION = "retention"


EVENTS = frozenset(e.value for e in Event)
"""Every valid ``event`` value, as plain strings (for checking records read back from files)."""


def make_record(
    event: Event | str,
    step: int | None,
    *,
    rank: int,
    role: str,
    ts: float | None = None,
    mono: float | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The one place an event record is built: refuses an event name outside :class:`Event`.

    ``ts``/``mono`` default to now; a simulation passes its own clock.
    """
    try:
        name = Event(event).value
    except ValueError:
        raise ValueError(f"unknown event {event!r}") from None
    return {
        "ts": time.time() if ts is None else ts,
        "mono": time.monotonic() if mono is None else mono,
        "rank": rank,
        "role": role,
        "event": name,
        "step": step,
        **fields,
    }


def rank_path(path: str, rank: int) -> str:
    """The per-rank file for a configured events path: ``{rank}`` is substituted, else ``.rank{N}`` appended."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.jsonl'}"


class EventLog:
    """Appends events to a JSONL file (or nowhere) and hands each to the listeners (metrics).

    Thread-safe; each line is written with a single ``write`` on an ``O_APPEND`` descriptor so a writer process and
    its trainer can share one file without tearing lines.
    """

    def __init__(self, path: str | None, *, rank: int, role: str) -> None:
        self.path = path
        self.rank = rank
        self.role = role
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def add_listener(self, fn: Callable[[dict[str, Any]], None]) -> None:
        self._listeners.append(fn)

    def emit(self, event: Event | str, step: int | None = None, **fields: Any) -> dict[str, Any]:
        record = make_record(event, step, rank=self.rank, role=self.role, **fields)
        self.record(record)
        return record

    def record(self, record: dict[str, Any]) -> None:
        """Write an already-built record (e.g. forwarded from the writer) and notify listeners."""
        with self._lock:
            if self._fd is not None:
                os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        for fn in self._listeners:
            fn(record)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
