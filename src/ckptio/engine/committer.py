"""What happens to a rank's save after its rank index is durable: commit, or watch for the commit; then cleanup.

One background thread per writer takes jobs in order. On rank 0 it is the committer: all rank indexes of this
save present → (after a restore: retire the abandoned trajectory) → uncommit a step saved before → ``.metadata``
→ manifest → ``latest``, then retention on the durable tier (see ``format.rollback`` for the rules). On other
ranks it watches for the manifest of its own save. Either way it tells the trainer :class:`SaveDone` or
:class:`SaveFailed` — or :class:`SaveDropped` when a rank gave the attempt up on purpose and left a drop marker (the
ranks agree on commit-or-drop through the store, never through a collective) — then evicts older steps from the
local tier. A failed or dropped save's data files are deleted from both tiers at once (a full disk must not fill
up with leftovers). Cleanup runs after ``done`` is sent: a save is done once its manifest exists, and a failed
deletion must never fail it. Every deletion runs under
:meth:`LiveSteps.cleaning` and leaves live steps alone.

It must never write a data file or a rank index (the job pipeline in ``engine.writer`` does), nor read a
staging slot.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ckptio.engine.live import LiveSteps
from ckptio.engine.ownership import ensure_lease
from ckptio.engine.protocol import CommitInfo, Outbox, Rollback, SaveDone, SaveDropped, SaveFailed, WriterStart
from ckptio.errors import (
    AlreadyExistsError,
    CkptError,
    CommitError,
    CorruptCheckpointError,
    RootInUseError,
    StorageError,
)
from ckptio.format import (
    Manifest,
    RankIndex,
    all_step_dirs,
    apply_retention,
    checksum,
    committed_steps,
    manifest_key,
    read_failure_markers,
    remove_unlisted_files,
    step_dir,
    update_latest,
    versions,
    write_failure,
    write_manifest,
)
from ckptio.format.layout import data_file_name
from ckptio.format.retention import read_retired
from ckptio.format.rollback import (
    Superseded,
    delete_data_files,
    drop_superseded,
    point_latest_at_newest,
    reinstate,
    retire_abandoned,
    uncommit,
)
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import join_key

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One save whose rank index is durable, handed from the job pipeline to the committer thread."""

    step: int
    save_id: int
    metadata_skeleton: bytes | None
    """Rank 0 only: the plan's pickled DCP Metadata without storage_data."""
    n_files: int = 0
    """This rank's data files in the save (deleted from both tiers should it fail)."""
    rollback: Rollback | None = None
    replaces: tuple[int, ...] = ()
    """Save ids whose manifest of this step this save may supersede (the trainer's earlier saves of it)."""

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
    commit: CommitInfo
    manifest: Manifest


def report_failure(out: Outbox, start: WriterStart, step: int, save_id: int, exc: BaseException) -> None:
    """Tell the trainer a save failed, always with a CkptError (it names the root, step and rank)."""
    out.event(Event.SAVE_FAILED, step, error=str(exc), error_type=type(exc).__name__)
    if not isinstance(exc, CkptError):
        wrapped = StorageError(f"{type(exc).__name__}: {exc}", root=start.durable.url, step=step, rank=start.rank)
        wrapped.__cause__ = None
        exc = wrapped
    out.send(SaveFailed(step, save_id, exc))


def discard_attempt(start: WriterStart, step: int, save_id: int, n_files: int) -> None:
    """Delete this rank's data files of a failed save from both tiers (best effort: the disk may be failing)."""
    names = [data_file_name(start.rank, n, save_id) for n in range(n_files)]
    for tier in (start.local, start.durable):
        if tier is not None:
            with contextlib.suppress(StorageError):
                delete_data_files(tier, step, names)


class _Dropped(Exception):
    """A rank gave up this save on purpose (a drop marker): it commits nowhere and is reported as skipped."""


class Committer:
    """The commit (rank 0) or watch (other ranks) thread of one writer, with retention and local eviction."""

    def __init__(self, start: WriterStart, out: Outbox, live: LiveSteps) -> None:
        self.start, self.out, self.live = start, out, live
        self.durable = start.durable
        self._requests: queue.Queue[CommitRequest | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="ckptio-commit", daemon=True)
        self._thread.start()

    def submit(self, request: CommitRequest) -> None:
        self._requests.put(request)

    def close(self) -> None:
        """Finish the queued commits, then stop the thread."""
        self._requests.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while (request := self._requests.get()) is not None:
            try:
                done, superseded = self._commit(request) if self.start.rank == 0 else self._watch(request)
            except _Dropped as drop:
                discard_attempt(self.start, request.step, request.save_id, request.n_files)
                self.live.remove(request.step)
                self.out.send(SaveDropped(request.step, request.save_id, str(drop)))
                continue
            except BaseException as exc:
                if self.start.rank == 0:
                    write_failure(self.durable, request.step, "commit", request.save_id, exc)
                discard_attempt(self.start, request.step, request.save_id, request.n_files)
                self.live.remove(request.step)
                report_failure(self.out, self.start, request.step, request.save_id, exc)
                continue
            # Cleanup holds off new saves' registration, so it cannot miss one that starts meanwhile.
            with self.live.cleaning():
                self.live.remove(request.step)
                self.out.send(SaveDone(request.step, request.save_id, done.commit))
                live = self.live.steps()
                self._evict_local(request.step, live)
                if self.start.rank == 0:
                    self._retain(request.step, live, superseded, done.manifest)

    def _wait_for(self, request: CommitRequest, ready: Callable[[], T | None]) -> T:
        """Poll ``ready()`` with backoff until it returns non-None, a failure marker appears, or time runs out."""
        timeout_s = self.start.config.commit_timeout_s
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            result = ready()
            if result is not None:
                return result
            markers = read_failure_markers(self.durable, request.step, request.save_id)
            failures = [text for text, dropped in markers if not dropped]
            if failures:
                raise CommitError("another rank failed this save: " + "; ".join(failures),
                                  root=self.durable.url, step=request.step, rank=self.start.rank)
            if markers:  # dropped on purpose by a rank: no rank's index of it ever completes the set
                raise _Dropped("; ".join(text for text, _ in markers))
            if time.monotonic() > deadline:
                raise CommitError(f"timed out after {timeout_s:.0f} s waiting for the commit",
                                  root=self.durable.url, step=request.step, rank=self.start.rank)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _gather_indexes(self, request: CommitRequest) -> list[RankIndex] | None:
        world_size = self.start.world_size
        prefix = join_key(step_dir(request.step), "ranks") + "/"
        keys = [i.key for i in self.durable.list(prefix)]
        if len(keys) < world_size:
            return None
        indexes = [RankIndex.from_json(raw, key=k) for k, raw in self.durable.get_many(keys).items()]
        current = [ix for ix in indexes if ix.save_id == request.save_id]
        if len({ix.rank for ix in current}) < world_size:
            self._refuse_if_taken(request)
            return None  # some ranks still show an index from an older attempt at this step
        return sorted(current, key=lambda ix: ix.rank)

    def _refuse_if_taken(self, request: CommitRequest) -> None:
        """Fail at once, not after commit_timeout_s, when another save committed this step and this one may not
        replace it: a racing job's rank indexes overwrote ours, so ours would never complete."""
        try:
            manifest = Manifest.from_json(self.durable.get(manifest_key(request.step)))
        except (StorageError, CorruptCheckpointError):
            return
        if manifest.save_id != request.save_id and not request.may_replace(manifest):
            raise CommitError("step is already committed by another save", root=self.durable.url, step=request.step)

    def _lock_step(self, step: int, save_id: int) -> str:
        """Create-only ``commit.lock`` in the step directory for the ``.metadata`` → manifest window: a second
        committer of the same step (two jobs racing on one root with ownership off) fails here instead of
        overwriting the winner's ``.metadata``. A lock older than ``commit_timeout_s`` is a crashed committer's."""
        key = join_key(step_dir(step), "commit.lock")
        body = json.dumps({"save_id": save_id, "time": time.time()}).encode()
        for _ in range(2):
            try:
                self.durable.put(key, body, mode="create")
                return key
            except AlreadyExistsError:
                try:
                    held = json.loads(self.durable.get(key))
                except (StorageError, ValueError):
                    held = {}
                if held.get("save_id") == save_id:
                    return key
                if time.time() - float(held.get("time", 0)) < self.start.config.commit_timeout_s:
                    raise CommitError("another save is committing this step", root=self.durable.url,
                                      step=step) from None
                self.durable.delete(key)  # stale: its committer died
        raise CommitError("cannot take the step's commit lock", root=self.durable.url, step=step)

    def _commit(self, request: CommitRequest) -> tuple[_Committed, Superseded | None]:
        durable, step = self.durable, request.step
        t0 = time.monotonic()
        indexes = self._wait_for(request, lambda: self._gather_indexes(request))
        if request.metadata_skeleton is None:
            raise CorruptCheckpointError("rank 0 job carries no metadata", step=step)
        # Only rank 0's committer needs DCP's classes (unpickling the skeleton loads torch too): other ranks'
        # writers never import torch.
        from ckptio.engine.dcp import build_metadata

        skeleton = pickle.loads(request.metadata_skeleton)
        metadata = build_metadata(skeleton, indexes, checkpoint_id=join_key(durable.url, step_dir(step)))
        t1 = time.monotonic()
        ensure_lease(durable, self.start.owner)  # a job that lost the root to another never commits into it
        retired = self._retire(request)
        raw_metadata = pickle.dumps(metadata)
        files = {f.name: f for ix in indexes for f in ix.files}
        manifest = Manifest(step=step, world_size=self.start.world_size, save_id=request.save_id, files=files,
                            total_bytes=sum(f.size for f in files.values()), versions=versions(),
                            metadata_crc32c=checksum([raw_metadata]))
        # A step saved again supersedes the committed one: uncommit it first, so that no reader ever pairs the
        # old manifest with the new .metadata.
        lock = self._lock_step(step, request.save_id)
        try:
            superseded = uncommit(durable, step, save_id=request.save_id, may_replace=request.may_replace)
            try:
                durable.put(join_key(step_dir(step), ".metadata"), raw_metadata)
                t2 = time.monotonic()
                ensure_lease(durable, self.start.owner)
                write_manifest(durable, manifest, verify=self.start.config.commit == "lease")
            except BaseException:
                if superseded is not None:
                    reinstate(durable, step, superseded)
                raise
        finally:
            with contextlib.suppress(StorageError):
                durable.delete(lock)
        t3 = time.monotonic()
        self.out.event(Event.PHASE, step, phase=Phase.METADATA, seconds=t2 - t1, bytes=0, tier="durable",
                       waited_s=t1 - t0)
        self.out.event(Event.PHASE, step, phase=Phase.MANIFEST, seconds=t3 - t2, bytes=0, tier="durable")
        if retired:
            point_latest_at_newest(durable)
        else:
            update_latest(durable, step)
        return _Committed(CommitInfo(total_bytes=manifest.total_bytes, files=len(files)), manifest), superseded

    def _retire(self, request: CommitRequest) -> list[int]:
        """After a restore, the first commit above the restored step retires the abandoned later steps first."""
        rollback = request.rollback
        if rollback is None or request.step <= rollback.above:
            return []
        with self.live.cleaning() as live:
            retired = retire_abandoned(self.durable, above=rollback.above, keep=request.step,
                                       own_save_ids=rollback.own_save_ids, live=live,
                                       markers_kept_s=self.start.config.commit_timeout_s)
        if retired:
            self.out.event(Event.STEPS_RETIRED, request.step, restored_step=rollback.above, retired=retired)
        return retired

    def _watch(self, request: CommitRequest) -> tuple[_Committed, None]:
        def manifest_ready() -> Manifest | None:
            try:
                raw = self.durable.get(manifest_key(request.step))
            except StorageError:
                # Rank 0 may have committed this save and retention already deleted it (keep_last=1, fast
                # saves): its record of retired steps says so.
                if read_retired(self.durable).get(request.step) == request.save_id:
                    return Manifest(step=request.step, world_size=self.start.world_size, save_id=request.save_id,
                                    files={}, total_bytes=0)
                return None
            manifest = Manifest.from_json(raw)
            # Another save's manifest is the step this save supersedes: rank 0 replaces it, keep watching.
            return manifest if manifest.save_id == request.save_id else None

        manifest = self._wait_for(request, manifest_ready)
        return _Committed(CommitInfo(total_bytes=manifest.total_bytes, files=len(manifest.files)), manifest), None

    def _retain(self, step: int, live: frozenset[int], superseded: Superseded | None, manifest: Manifest) -> None:
        """Garbage of a superseded save and steps beyond keep_last; runs after the trainer heard "done".

        Retention waits (until a later commit) while a save of a step it could delete is live: it deletes only
        committed steps below the newest and uncommitted directories below ``step``.
        """
        durable, t0 = self.durable, time.monotonic()
        removed: list[int] = []
        try:
            ensure_lease(durable, self.start.owner)  # never delete in a root another job now owns
            if superseded is not None:
                drop_superseded(durable, step, superseded, manifest)
            if step not in live:  # a crashed attempt's leftovers; never while another save of this step runs
                remove_unlisted_files(durable, manifest)
            others = live - {step}
            if not others or min(others) > max(committed_steps(durable), default=-1):
                # Markers stay as long as another rank's watcher may still wait for them (format.retention).
                removed = apply_retention(durable, keep_last=self.start.config.keep_last, newest_committed=step,
                                          markers_kept_s=self.start.config.commit_timeout_s)
        except (StorageError, CorruptCheckpointError, RootInUseError) as exc:
            # A failed deletion must not fail the commit; retention is retried at the next one.
            self.out.event(Event.RETRY, step, op="retention", attempt=1, error=str(exc))
        self.out.event(Event.PHASE, step, phase=Phase.RETENTION, seconds=time.monotonic() - t0, bytes=0,
                       tier="durable", removed=removed)

    def _evict_local(self, committed_step: int, live: frozenset[int]) -> None:
        """The local tier keeps only the newest committed step of this rank (and anything in flight)."""
        local = self.start.local
        if local is None:
            return
        for step in all_step_dirs(local):
            if step < committed_step and step not in live:
                try:
                    local.delete_prefix(step_dir(step))
                except StorageError:
                    pass  # best effort: the next commit retries
