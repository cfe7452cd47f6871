"""One commit protocol for every level: once a rank's index of a save is in a level's records, commit the step
(rank 0) or watch for its commit (the other ranks), then clean up.

A level is a :class:`CommitLevel`: where its records live (the durable root, or the local level's subtree of it:
``format.local_level``), how many committed steps it keeps, and what runs after a commit. Each writer runs one
:class:`StepCommitter` thread per level, jobs in order, and both levels follow the same steps:

* Rank 0 commits: every rank index of this save present → after a restore, retire the abandoned trajectory on every
  level (``format.rollback``) → the step's commit lock → uncommit the step this save supersedes → ``.metadata`` →
  manifest, create-only (the commit) → ``latest`` → retention, which records the steps it removes in the level's
  ``retired.json``.
* Every other rank watches for the manifest of its own save; a step that rank 0 committed and retention already
  removed is found in ``retired.json`` — the one way a watcher learns that its step was retired, on both levels.
* A failure or drop marker of the save (any rank's) ends the wait at once: failed, or dropped when a rank gave the
  attempt up on purpose (the ranks agree on commit-or-drop through the store, never a collective).

Every outcome goes to the level's :class:`~ckptio.engine.writer.level_outcome.LevelOutcome`, the one place an
attempt ends on a level (marker, deletion, message). Cleanup runs after the outcome is sent, under
:meth:`LiveSteps.cleaning`, and leaves live steps alone: a failed deletion must never fail a committed save.

It must never write a data file or a rank index (the job pipeline does), nor read a staging slot.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import queue
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TypeVar

from ckptio.engine.owner_record import ensure_lease
from ckptio.engine.protocol import Outbox, Rollback, WriterStart
from ckptio.engine.writer.level_outcome import Attempt, LevelOutcome
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.errors import (
    AlreadyExistsError,
    CommitError,
    CorruptCheckpointError,
    RootInUseError,
    StorageError,
)
from ckptio.format import (
    Manifest,
    RankIndex,
    apply_retention,
    checksum,
    committed_steps,
    manifest_key,
    read_failure_markers,
    remove_unlisted_files,
    step_dir,
    update_latest,
    versions,
    write_manifest,
)
from ckptio.format.retention import read_retired
from ckptio.format.rollback import (
    Superseded,
    drop_superseded,
    point_latest_at_newest,
    reinstate,
    retire_abandoned,
    uncommit,
)
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import Storage, join_key

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CommitLevel:
    """What distinguishes one level's commits from another's."""

    name: str
    """``durable`` or ``local`` (events, messages)."""
    records: Storage
    """Where rank indexes, markers, ``.metadata``, manifests, ``latest`` and ``retired.json`` live."""
    keep_last: int
    """Committed steps kept by retention (0: all)."""
    retire_also: tuple[Storage, ...] = ()
    """The other levels' records: a rollback retires the abandoned trajectory on every level at once."""
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
        self.records = level.records
        self._requests: queue.Queue[CommitRequest | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=f"ckptio-commit-{level.name}", daemon=True)
        self._thread.start()

    def submit(self, request: CommitRequest) -> None:
        self._requests.put(request)

    def close(self) -> None:
        """Finish the queued commits, then stop the thread."""
        self._requests.put(None)
        self._thread.join()

    # ---- one request --------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while (request := self._requests.get()) is not None:
            attempt = request.attempt
            try:
                if request.prepare is not None:
                    request.prepare()
                manifest, superseded = self._commit(request) if self.start.rank == 0 else self._watch(request)
            except _Dropped as drop:
                self.outcome.dropped(attempt, str(drop))
                continue
            except _FailedElsewhere as failed:
                self.outcome.failed(attempt, failed.error, mark=False)
                continue
            except BaseException as exc:
                self.outcome.failed(attempt, exc, who="commit" if self.start.rank == 0 else None)
                continue
            # Cleanup holds off new saves' registration, so it cannot miss one that starts meanwhile.
            with self.live.cleaning():
                self.live.remove(request.step)
                self.outcome.committed(attempt, manifest)
                live = self.live.steps()
                if self.level.after_commit is not None:
                    self.level.after_commit(request.step, live)
                if self.start.rank == 0:
                    self._retain(request.step, live, superseded, manifest)

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

    def _lock_step(self, step: int, save_id: int) -> str:
        """Create-only ``commit.lock`` in the step directory for the ``.metadata`` → manifest window: a second
        committer of the same step (two jobs racing on one root with ownership off) fails here instead of
        overwriting the winner's ``.metadata``. A lock older than ``commit_timeout_s`` is a crashed committer's."""
        key = join_key(step_dir(step), "commit.lock")
        body = json.dumps({"save_id": save_id, "time": time.time()}).encode()
        for _ in range(2):
            try:
                self.records.put(key, body, mode="create")
                return key
            except AlreadyExistsError:
                try:
                    held = json.loads(self.records.get(key))
                except (StorageError, ValueError):
                    held = {}
                if held.get("save_id") == save_id:
                    return key
                if time.time() - float(held.get("time", 0)) < self.start.config.commit_timeout_s:
                    raise CommitError("another save is committing this step", root=self.records.url,
                                      step=step) from None
                self.records.delete(key)  # stale: its committer died
        raise CommitError("cannot take the step's commit lock", root=self.records.url, step=step)

    def _commit(self, request: CommitRequest) -> tuple[Manifest, Superseded | None]:
        records, step = self.records, request.step
        t0 = time.monotonic()
        indexes = self._wait_for(request, lambda: self._gather_indexes(request))
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
        superseded, t2 = self._write_commit(request, manifest, raw_metadata)
        t3 = time.monotonic()
        self.out.event(Event.PHASE, step, phase=Phase.METADATA, seconds=t2 - t1, bytes=0, tier=self.level.name,
                       waited_s=t1 - t0)
        self.out.event(Event.PHASE, step, phase=Phase.MANIFEST, seconds=t3 - t2, bytes=0, tier=self.level.name)
        if retired:
            point_latest_at_newest(records)
        else:
            update_latest(records, step)
        return manifest, superseded

    def _write_commit(self, request: CommitRequest, manifest: Manifest,
                      raw_metadata: bytes) -> tuple[Superseded | None, float]:
        """Under the step's lock: uncommit what this save supersedes, ``.metadata``, then the manifest. A step
        saved again is uncommitted first, so that no reader ever pairs the old manifest with the new
        ``.metadata``; should the new commit fail, the old one is put back."""
        records, step = self.records, request.step
        lock = self._lock_step(step, request.save_id)
        try:
            superseded = uncommit(records, step, save_id=request.save_id, may_replace=request.may_replace)
            try:
                records.put(join_key(step_dir(step), ".metadata"), raw_metadata)
                t2 = time.monotonic()
                ensure_lease(self.start.durable, self.start.owner)
                write_manifest(records, manifest, verify=self.start.config.commit == "lease")
            except BaseException:
                if superseded is not None:
                    reinstate(records, step, superseded)
                raise
        finally:
            with contextlib.suppress(StorageError):
                records.delete(lock)
        return superseded, t2

    def _retire(self, request: CommitRequest) -> list[int]:
        """After a restore, the first commit above the restored step retires the abandoned later steps first, on
        every level: a step the other level holds from the abandoned trajectory must not win the next restore."""
        rollback = request.rollback
        if rollback is None or request.step <= rollback.above:
            return []
        retired: list[int] = []
        with self.live.cleaning() as live:
            for records in (self.records, *self.level.retire_also):
                retired += retire_abandoned(records, above=rollback.above, keep=request.step,
                                            own_save_ids=rollback.own_save_ids, live=live,
                                            markers_kept_s=self.start.config.commit_timeout_s)
        if retired:
            self.out.event(Event.STEPS_RETIRED, request.step, restored_step=rollback.above,
                           retired=sorted(set(retired)), level=self.level.name)
        return retired

    # ---- other ranks --------------------------------------------------------------------------------------------
    def _watch(self, request: CommitRequest) -> tuple[Manifest, None]:
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

        return self._wait_for(request, manifest_ready), None

    # ---- cleanup (rank 0) ---------------------------------------------------------------------------------------
    def _retain(self, step: int, live: frozenset[int], superseded: Superseded | None, manifest: Manifest) -> None:
        """Garbage of a superseded save and steps beyond keep_last; runs after the trainer heard "done".

        Retention waits (until a later commit) while a save of a step it could delete is live: it deletes only
        committed steps below the newest and uncommitted directories below ``step``.
        """
        records, t0 = self.records, time.monotonic()
        removed: list[int] = []
        try:
            ensure_lease(self.start.durable, self.start.owner)  # never delete in a root another job now owns
            if superseded is not None:
                drop_superseded(records, step, superseded, manifest)
            if step not in live:  # a crashed attempt's leftovers; never while another save of this step runs
                remove_unlisted_files(records, manifest)
            if _no_live_step_below_newest(records, live - {step}):
                # Markers stay as long as another rank's watcher may still wait for them (format.retention).
                removed = apply_retention(records, keep_last=self.level.keep_last, newest_committed=step,
                                          markers_kept_s=self.start.config.commit_timeout_s)
        except (StorageError, CorruptCheckpointError, RootInUseError) as exc:
            # A failed deletion must not fail the commit; retention is retried at the next one.
            self.out.event(Event.RETRY, step, op="retention", attempt=1, error=str(exc))
        self.out.event(Event.PHASE, step, phase=Phase.RETENTION, seconds=time.monotonic() - t0, bytes=0,
                       tier=self.level.name, removed=removed)


def _no_live_step_below_newest(records: Storage, others: Collection[int]) -> bool:
    return not others or min(others) > max(committed_steps(records), default=-1)
