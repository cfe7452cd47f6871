"""Rank 0's cleanup of one level's records: retention after each commit, leftovers at start, at close and after a
failed attempt, and supersedes a crash interrupted.

**Constant metadata per commit.** The committed steps a level holds are listed once, when the writer starts
(:class:`CommittedSteps`), and from then on kept by the commits themselves: each commit adds its step, retention
and rollback remove theirs. Retention after a commit (``format.retention.retain``) reads only the manifests of the
steps it deletes, so a commit's metadata operations do not grow with the steps or files already on the root. The
listing sweep for leftovers of crashed or failed attempts (``format.retention.remove_leftovers``) runs when the
writer starts, when it closes, and after the first commit that follows a failed attempt of this level, never on
every commit. Every deletion runs under :meth:`LiveSteps.cleaning` and leaves live steps alone.

It never writes a data file, a rank index or a manifest, and a failed deletion never fails a committed save.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from ckptio.engine.owner_record import ensure_lease
from ckptio.engine.protocol import Outbox, WriterStart
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.errors import CorruptCheckpointError, RootInUseError, StorageError
from ckptio.format import Manifest, committed_steps
from ckptio.format.retention import remove_leftovers, remove_unlisted_files, retain
from ckptio.format.rollback import Superseded, drop_superseded, finish_supersede
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import Storage


class CommittedSteps:
    """The committed steps of one level's records, as this writer knows them: listed once, then kept by commits.

    Shared by the committers of both levels (a rollback on one level retires steps of the other), hence the lock.
    """

    def __init__(self, records: Storage) -> None:
        self.records = records
        self._lock = threading.Lock()
        self._steps: list[int] | None = None

    def steps(self) -> list[int]:
        with self._lock:
            if self._steps is None:
                self._steps = committed_steps(self.records)
            return list(self._steps)

    def add(self, step: int) -> None:
        with self._lock:
            if self._steps is not None and step not in self._steps:
                self._steps = sorted([*self._steps, step])

    def forget(self, steps: Iterable[int]) -> None:
        gone = set(steps)
        with self._lock:
            if self._steps is not None:
                self._steps = [s for s in self._steps if s not in gone]


class LevelCleanup:
    """What rank 0's committer of one level deletes, and when."""

    def __init__(self, name: str, committed: CommittedSteps, start: WriterStart, out: Outbox, live: LiveSteps, *,
                 keep_last: int) -> None:
        self.name, self.committed, self.start, self.out, self.live = name, committed, start, out, live
        self.records, self.keep_last = committed.records, keep_last
        self._leftovers_due = True  # the first sweep runs when the writer starts

    def at_start(self) -> None:
        """Finish supersedes a crash interrupted, then sweep leftovers (the one listing of a writer's start)."""
        try:
            ensure_lease(self.start.durable, self.start.owner)
            for step in self.committed.steps():
                finish_supersede(self.records, step)
        except (StorageError, CorruptCheckpointError, RootInUseError) as exc:
            self.out.event(Event.RETRY, None, op="finish_supersede", attempt=1, error=str(exc))
        self.sweep()

    def attempt_failed(self) -> None:
        """An attempt of this level failed: its leftovers go at the next commit's cleanup."""
        self._leftovers_due = True

    def after_commit(self, step: int, live: frozenset[int], manifest: Manifest, superseded: Superseded | None) -> None:
        """Garbage of a superseded save and of earlier attempts at ``step`` (one listing of the step's own
        directory), then the steps beyond keep_last; runs after the trainer heard "done", under the caller's cleanup
        lock. Retention waits (until a later commit) while a save of a step it could delete is live."""
        t0, removed = time.monotonic(), []
        self.committed.add(step)
        try:
            ensure_lease(self.start.durable, self.start.owner)  # never delete in a root another job now owns
            if superseded is not None:
                drop_superseded(self.records, step, superseded, manifest)
            if step not in live:  # a crashed attempt's files; never while another save of this step runs
                remove_unlisted_files(self.records, manifest)
            steps = self.committed.steps()
            others = live - {step}
            if not others or min(others) > steps[-1]:
                removed = retain(self.records, committed=steps, keep_last=self.keep_last, newest_committed=step)
                self.committed.forget(removed)
        except (StorageError, CorruptCheckpointError, RootInUseError) as exc:
            # A failed deletion must not fail the commit; retention is retried at the next one.
            self.out.event(Event.RETRY, step, op="retention", attempt=1, error=str(exc))
        self.out.event(Event.PHASE, step, phase=Phase.RETENTION, seconds=time.monotonic() - t0, bytes=0,
                       tier=self.name, removed=removed)
        if self._leftovers_due:
            self.sweep(live)

    def sweep(self, live: frozenset[int] | None = None) -> None:
        """Delete leftovers of attempts that never committed, below the newest commit (one listing of the root)."""
        self._leftovers_due = False
        t0 = time.monotonic()
        try:
            ensure_lease(self.start.durable, self.start.owner)
            with self.live.cleaning() as now_live:
                steps = self.committed.steps()
                if not steps:
                    return
                gone = remove_leftovers(self.records, below=steps[-1], committed=set(steps),
                                        live=now_live | (live or frozenset()),
                                        markers_kept_s=self.start.config.commit_timeout_s)
        except (StorageError, CorruptCheckpointError, RootInUseError) as exc:
            self.out.event(Event.RETRY, None, op="leftovers", attempt=1, error=str(exc))
            return
        if gone:
            self.out.event(Event.PHASE, steps[-1], phase=Phase.RETENTION, seconds=time.monotonic() - t0, bytes=0,
                           tier=self.name, removed=[], leftovers=gone)
