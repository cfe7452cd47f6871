"""One commit protocol for every level: once a rank's index of a save is in a level's records, commit the step
(rank 0) or watch for its commit (the other ranks), then clean up.

A level is a :class:`CommitLevel`: where its records live (the durable root, or the local level's subtree of it:
``format.local_level_records``), how many committed steps it keeps, and what runs after a commit. Each writer runs one
:class:`StepCommitter` thread per level, jobs in order, and both levels follow the same steps:

* Rank 0 commits: every rank index of this save present → after a restore, retire the abandoned trajectory on every
  level (``format.rollback``) → the commit point under the step's lock (``commit_point``: ``.metadata`` and the
  manifest, create-only, or the crash-atomic supersede of a step saved again) → ``latest`` → cleanup
  (``level_cleanup``: retention, which records the steps it removes in the level's ``retired.json``).
* Every other rank watches for the manifest of its own save; a step that rank 0 committed and retention already
  removed is found in ``retired.json`` — the one way a watcher learns that its step was retired, on both levels.
* A failure or drop marker of the save (any rank's) ends the wait at once: failed, or dropped when a rank gave the
  attempt up on purpose (the ranks agree on commit-or-drop through the store, never a collective).

Every outcome goes to the level's :class:`~ckptio.engine.writer.level_outcome.LevelOutcome`, the one place an
attempt ends on a level (marker, deletion, message). Cleanup runs after the outcome is sent, under
:meth:`LiveSteps.cleaning`, and leaves live steps alone: a failed deletion must never fail a committed save.

**Back-pressure.** The committer counts the requests it has not finished (queued, committing, or cleaning up);
:meth:`StepCommitter.wait_for_room` holds the job pipeline before it writes the next save's files while that count
exceeds ``max_pending``. So at most ``max_pending`` + 1 saves per level are written but not committed; the staging
slots the pipeline holds meanwhile make the trainer's ``overflow`` rule (block or skip) apply.

It must never write a data file or a rank index (the job pipeline does), nor read a staging slot.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ckptio.engine.owner_record import ensure_lease
from ckptio.engine.protocol import Outbox, Rollback, WriterStart
from ckptio.engine.writer.commit_point import CommitPoint
from ckptio.engine.writer.level_cleanup import CommittedSteps, LevelCleanup
from ckptio.engine.writer.level_outcome import Attempt, LevelOutcome
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.errors import CommitError, CorruptCheckpointError, StorageError
from ckptio.format import (
    Manifest,
    RankIndex,
    checksum,
    manifest_key,
    read_failure_markers,
    step_dir,
    update_latest,
    versions,
)
from ckptio.format.retention import read_retired
from ckptio.format.rollback import Superseded, point_latest_at_newest, retire_abandoned
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import join_key

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CommitLevel:
    """What distinguishes one level's commits from another's."""

    name: str
    """``durable`` or ``local`` (events, messages)."""
    committed: CommittedSteps
    """The level's records (rank indexes, markers, ``.metadata``, manifests, ``latest``, ``retired.json``) and the
    steps committed there."""
    keep_last: int
    """Committed steps kept by retention (0: all)."""
    retire_also: tuple[CommittedSteps, ...] = ()
    """The other levels: a rollback retires the abandoned trajectory on every level at once."""
    after_commit: Callable[[int, frozenset[int]], None] | None = None
    """Rank-local cleanup after a commit of ``step`` (the local tier's eviction), given the live steps."""


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One save whose rank index is in the level's records, handed from the level to its committer thread."""

    attempt: Attempt
    metadata_skeleton: bytes | None
    """Rank 0 only: the plan's pickled DCP Metadata without storage_data."""
    rollback: Rollback | None = None
    replaces: tuple[int, ...] = ()
    """Save ids whose manifest of this step this save may supersede (the trainer's earlier saves of it)."""
    prepare: Callable[[], None] | None = field(default=None, compare=False)
    """Runs first on the level's thread (the local level's copies and rank index); raising fails the level."""

    @property
    def step(self) -> int:
        return self.attempt.step

    @property
    def save_id(self) -> int:
        return self.attempt.save_id

    def may_replace(self, manifest: Manifest | None) -> bool:
        """May this save supersede ``manifest`` (None: unreadable) of its step? Its trainer's own earlier save of
        the step, or, after a restore below the step, anything this run did not save since."""
        if manifest is not None and manifest.save_id in self.replaces:
            return True
        rollback = self.rollback
        return rollback is not None and self.step > rollback.above and (
            manifest is None or manifest.save_id not in rollback.own_save_ids)


@dataclass(frozen=True, slots=True)
class _Committed:
    """What rank 0's commit of a request leaves for cleanup."""

    manifest: Manifest
    superseded: Superseded | None = None


class _Dropped(Exception):
    """A rank gave up this save on purpose (a drop marker): it commits nowhere and is reported as skipped."""


class _FailedElsewhere(Exception):
    """Another rank's failure marker ended the wait: the failure is already on the store, not marked again."""

    def __init__(self, error: CommitError) -> None:
        super().__init__(str(error))
        self.error = error


class StepCommitter:
    """The commit (rank 0) or watch (other ranks) thread of one writer for one level, with its cleanup."""

    def __init__(self, level: CommitLevel, start: WriterStart, out: Outbox, live: LiveSteps, *,
                 outcome: LevelOutcome) -> None:
        self.level, self.start, self.out, self.live, self.outcome = level, start, out, live, outcome
        self.records = level.committed.records
        config = start.config
        self.point = CommitPoint(level.name, self.records, timeout_s=config.commit_timeout_s,
                                 verify=config.commit == "lease",
                                 check_lease=lambda: ensure_lease(start.durable, start.owner),
                                 claim=start.owner.claim if start.owner is not None else "")
        self.cleanup = LevelCleanup(level.name, level.committed, start, out, live, keep_last=level.keep_last)
        self._requests: queue.Queue[CommitRequest | None] = queue.Queue()
        self._room = threading.Condition()
        self._unfinished = 0
        self._thread = threading.Thread(target=self._loop, name=f"ckptio-commit-{level.name}", daemon=True)
        self._thread.start()

    def submit(self, request: CommitRequest) -> None:
        with self._room:
            self._unfinished += 1
        self._requests.put(request)

    def wait_for_room(self, limit: int) -> float:
        """Return once at most ``limit`` requests are unfinished; the seconds waited."""
        t0 = time.monotonic()
        with self._room:
            self._room.wait_for(lambda: self._unfinished <= limit)
        return time.monotonic() - t0

    def unfinished(self) -> int:
        with self._room:
            return self._unfinished

    def close(self) -> None:
        """Finish the queued commits and a last leftover sweep (rank 0), then stop the thread."""
        self._requests.put(None)
        self._thread.join()

    # ---- one request --------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.start.rank == 0:
            self.cleanup.at_start()
        while (request := self._requests.get()) is not None:
            try:
                self._run(request)
            finally:
                with self._room:
                    self._unfinished -= 1
                    self._room.notify_all()
        if self.start.rank == 0:
            self.cleanup.sweep()

    def _run(self, request: CommitRequest) -> None:
        attempt, rank0 = request.attempt, self.start.rank == 0
        try:
            if request.prepare is not None:
                request.prepare()
            committed = self._commit(request) if rank0 else _Committed(self._watch(request))
        except _Dropped as drop:
            self.outcome.dropped(attempt, str(drop))
            return
        except _FailedElsewhere as failed:
            self.outcome.failed(attempt, failed.error, mark=False)
            self.cleanup.attempt_failed()
            return
        except BaseException as exc:
            self.outcome.failed(attempt, exc, who="commit" if rank0 else None)
            self.cleanup.attempt_failed()
            return
        # Cleanup holds off new saves' registration, so it cannot miss one that starts meanwhile.
        with self.live.cleaning():
            self.live.remove(request.step)
            self.outcome.committed(attempt, committed.manifest)
            live = self.live.steps()
            if self.level.after_commit is not None:
                self.level.after_commit(request.step, live)
            if rank0:
                self.cleanup.after_commit(request.step, live, committed.manifest, committed.superseded)

    def _wait_for(self, request: CommitRequest, ready: Callable[[], T | None]) -> T:
        """Poll ``ready()`` with backoff until it returns non-None, a failure marker appears, or time runs out."""
        timeout_s = self.start.config.commit_timeout_s
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            result = ready()
            if result is not None:
                return result
            markers = read_failure_markers(self.records, request.step, request.save_id)
            failures = [text for text, dropped in markers if not dropped]
            if failures:
                raise _FailedElsewhere(CommitError(f"{self.level.name} level: another rank failed this save: "
                                                   + "; ".join(failures), root=self.records.url, step=request.step,
                                                   rank=self.start.rank))
            if markers:  # dropped on purpose by a rank: no rank's index of it ever completes the set
                raise _Dropped("; ".join(text for text, _ in markers))
            if time.monotonic() > deadline:
                raise CommitError(f"{self.level.name} level: timed out after {timeout_s:.0f} s waiting for the "
                                  "commit", root=self.records.url, step=request.step, rank=self.start.rank)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    # ---- rank 0 -------------------------------------------------------------------------------------------------
    def _gather_indexes(self, request: CommitRequest) -> list[RankIndex] | None:
        """Every rank's index of this save, or None."""
        world_size = self.start.world_size
        keys = [i.key for i in self.records.list(join_key(step_dir(request.step), "ranks") + "/")]
        if len(keys) < world_size:
            return None
        indexes = [RankIndex.from_json(raw, key=k) for k, raw in self.records.get_many(keys).items()]
        current = [ix for ix in indexes if ix.save_id == request.save_id]
        if len({ix.rank for ix in current}) < world_size:
            self._refuse_if_taken(request)
            return None  # some ranks still show an index from an older attempt at this step
        return sorted(current, key=lambda ix: ix.rank)

    def _refuse_if_taken(self, request: CommitRequest) -> None:
        """Fail at once, not after commit_timeout_s, when another save committed this step and this one may not
        replace it: a racing job's rank indexes overwrote ours, so ours would never complete."""
        try:
            manifest = Manifest.from_json(self.records.get(manifest_key(request.step)))
        except (StorageError, CorruptCheckpointError):
            return
        if manifest.save_id != request.save_id and not request.may_replace(manifest):
            raise CommitError("step is already committed by another save", root=self.records.url, step=request.step)

    def _commit(self, request: CommitRequest) -> _Committed:
        records, step = self.records, request.step
        t0 = time.monotonic()
        indexes = self._wait_for(request, lambda: self._gather_indexes(request))
        ready = time.monotonic()
        if request.metadata_skeleton is None:
            raise CorruptCheckpointError("rank 0 job carries no metadata", step=step)
        # Only rank 0's committer needs DCP's classes (unpickling the skeleton loads torch too): other ranks'
        # writers never import torch.
        from ckptio.engine.writer.dcp_metadata import build_metadata

        skeleton = pickle.loads(request.metadata_skeleton)
        metadata = build_metadata(skeleton, indexes, checkpoint_id=join_key(records.url, step_dir(step)))
        t1 = time.monotonic()
        ensure_lease(self.start.durable, self.start.owner)  # a job that lost the root never commits into it
        retired = self._retire(request)
        raw_metadata = pickle.dumps(metadata)
        files = {f.name: f for ix in indexes for f in ix.files}
        manifest = Manifest(step=step, world_size=self.start.world_size, save_id=request.save_id, files=files,
                            total_bytes=sum(f.size for f in files.values()), versions=versions(),
                            metadata_crc32c=checksum([raw_metadata]))
        superseded = self.point.write(manifest, raw_metadata, may_replace=request.may_replace)
        t2 = time.monotonic()
        self.out.event(Event.PHASE, step, phase=Phase.METADATA, seconds=t1 - ready, bytes=0, tier=self.level.name,
                       waited_s=ready - t0)
        self.out.event(Event.PHASE, step, phase=Phase.MANIFEST, seconds=t2 - t1, bytes=0, tier=self.level.name)
        if retired:
            point_latest_at_newest(records)
        else:
            update_latest(records, step)
        return _Committed(manifest, superseded)

    def _retire(self, request: CommitRequest) -> list[int]:
        """After a restore, the first commit above the restored step retires the abandoned later steps first, on
        every level: a step the other level holds from the abandoned trajectory must not win the next restore."""
        rollback = request.rollback
        if rollback is None or request.step <= rollback.above:
            return []
        retired: list[int] = []
        with self.live.cleaning() as live:
            for level in (self.level.committed, *self.level.retire_also):
                gone = retire_abandoned(level.records, above=rollback.above, keep=request.step,
                                        own_save_ids=rollback.own_save_ids, live=live,
                                        markers_kept_s=self.start.config.commit_timeout_s)
                level.forget(gone)
                retired += gone
        if retired:
            self.out.event(Event.STEPS_RETIRED, request.step, restored_step=rollback.above,
                           retired=sorted(set(retired)), level=self.level.name)
        return retired

    # ---- other ranks --------------------------------------------------------------------------------------------
    def _watch(self, request: CommitRequest) -> Manifest:
        def manifest_ready() -> Manifest | None:
            try:
                raw = self.records.get(manifest_key(request.step))
            except StorageError:
                # Rank 0 may have committed this save and retention already deleted it (keep_last=1, fast
                # saves): the level's record of retired steps says so.
                if read_retired(self.records).get(request.step) == request.save_id:
                    return Manifest(step=request.step, world_size=self.start.world_size, save_id=request.save_id,
                                    files={}, total_bytes=0)
                return None
            manifest = Manifest.from_json(raw)
            # Another save's manifest is the step this save supersedes: rank 0 replaces it, keep watching.
            return manifest if manifest.save_id == request.save_id else None

        return self._wait_for(request, manifest_ready)
