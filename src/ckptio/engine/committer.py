"""What happens to a rank's save after its rank index is durable: commit, or watch for the commit; then cleanup.

One background thread per writer takes jobs in order. On rank 0 it is the committer: all rank indexes of this
save present → ``.metadata`` → manifest → ``latest``, then retention on the durable tier. On other ranks it
watches for the manifest of its own save. Either way it tells the trainer :class:`SaveDone` or
:class:`SaveFailed`, then evicts older steps from the local tier. Cleanup runs after ``done`` is sent: a save is
done once its manifest exists, and a failed deletion must never fail it.

It must never write a data file or a rank index (the job pipeline in ``engine.writer`` does), nor read a
staging slot.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ckptio.engine.ownership import ensure_lease
from ckptio.engine.protocol import CommitInfo, Outbox, SaveDone, SaveFailed, WriterStart
from ckptio.errors import CkptError, CommitError, CorruptCheckpointError, RootInUseError, StorageError
from ckptio.format import (
    Manifest,
    RankIndex,
    all_step_dirs,
    apply_retention,
    checksum,
    manifest_key,
    read_failures,
    read_manifest,
    remove_unlisted_files,
    step_dir,
    update_latest,
    versions,
    write_failure,
    write_manifest,
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


def report_failure(out: Outbox, start: WriterStart, step: int, exc: BaseException) -> None:
    """Tell the trainer a save failed, always with a CkptError (it names the root, step and rank)."""
    out.event(Event.SAVE_FAILED, step, error=str(exc), error_type=type(exc).__name__)
    if not isinstance(exc, CkptError):
        wrapped = StorageError(f"{type(exc).__name__}: {exc}", root=start.durable.url, step=step, rank=start.rank)
        wrapped.__cause__ = None
        exc = wrapped
    out.send(SaveFailed(step, exc))


class Committer:
    """The commit (rank 0) or watch (other ranks) thread of one writer, with retention and local eviction."""

    def __init__(self, start: WriterStart, out: Outbox) -> None:
        self.start, self.out = start, out
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
                info = self._commit(request) if self.start.rank == 0 else self._watch(request)
                self.out.send(SaveDone(request.step, info))
            except BaseException as exc:
                if self.start.rank == 0:
                    write_failure(self.durable, request.step, "commit", request.save_id, exc)
                report_failure(self.out, self.start, request.step, exc)
                continue
            self._evict_local(request.step)
            if self.start.rank == 0:
                self._retain(request.step)

    def _wait_for(self, request: CommitRequest, ready: Callable[[], T | None]) -> T:
        """Poll ``ready()`` with backoff until it returns non-None, a failure marker appears, or time runs out."""
        timeout_s = self.start.config.commit_timeout_s
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            result = ready()
            if result is not None:
                return result
            failures = read_failures(self.durable, request.step, request.save_id)
            if failures:
                raise CommitError("another rank failed this save: " + "; ".join(failures),
                                  root=self.durable.url, step=request.step, rank=self.start.rank)
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
            return None  # some ranks still show an index from an older attempt at this step
        return sorted(current, key=lambda ix: ix.rank)

    def _commit(self, request: CommitRequest) -> CommitInfo:
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
        if durable.exists(manifest_key(step)):
            # Never touch .metadata of a step someone else committed (a second job racing on this root).
            raise CommitError("step is already committed by another save", root=durable.url, step=step)
        raw_metadata = pickle.dumps(metadata)
        durable.put(join_key(step_dir(step), ".metadata"), raw_metadata)
        files = {f.name: f for ix in indexes for f in ix.files}
        manifest = Manifest(step=step, world_size=self.start.world_size, save_id=request.save_id, files=files,
                            total_bytes=sum(f.size for f in files.values()), versions=versions(),
                            metadata_crc32c=checksum([raw_metadata]))
        t2 = time.monotonic()
        ensure_lease(durable, self.start.owner)
        write_manifest(durable, manifest, verify=self.start.config.commit == "lease")
        t3 = time.monotonic()
        self.out.event(Event.PHASE, step, phase=Phase.METADATA, seconds=t2 - t1, bytes=0, tier="durable",
                       waited_s=t1 - t0)
        self.out.event(Event.PHASE, step, phase=Phase.MANIFEST, seconds=t3 - t2, bytes=0, tier="durable")
        update_latest(durable, step)
        return CommitInfo(total_bytes=manifest.total_bytes, files=len(files))

    def _watch(self, request: CommitRequest) -> CommitInfo:
        def manifest_ready() -> Manifest | None:
            try:
                raw = self.durable.get(manifest_key(request.step))
            except StorageError:
                return None
            return Manifest.from_json(raw)

        manifest = self._wait_for(request, manifest_ready)
        if manifest.save_id != request.save_id:
            raise CommitError("step was committed by another save", root=self.durable.url,
                              step=request.step, rank=self.start.rank)
        return CommitInfo(total_bytes=manifest.total_bytes, files=len(manifest.files))

    def _retain(self, step: int) -> None:
        """Garbage of earlier attempts and steps beyond keep_last; runs after the trainer heard "done"."""
        durable, t0 = self.durable, time.monotonic()
        removed: list[int]
        try:
            ensure_lease(durable, self.start.owner)  # never delete in a root another job now owns
            remove_unlisted_files(durable, read_manifest(durable, step))
            removed = apply_retention(durable, keep_last=self.start.config.keep_last, newest_committed=step)
        except (StorageError, CorruptCheckpointError, RootInUseError) as exc:
            # A failed deletion must not fail the commit; retention is retried at the next one.
            removed = []
            self.out.event(Event.RETRY, step, op="retention", attempt=1, error=str(exc))
        self.out.event(Event.PHASE, step, phase=Phase.RETENTION, seconds=time.monotonic() - t0, bytes=0,
                       tier="durable", removed=removed)

    def _evict_local(self, committed_step: int) -> None:
        """The local tier keeps only the newest committed step of this rank (and anything newer in flight)."""
        local = self.start.local
        if local is None:
            return
        for step in all_step_dirs(local):
            if step < committed_step:
                try:
                    local.delete_prefix(step_dir(step))
                except StorageError:
                    pass  # best effort: the next commit retries
