"""The durable level in the writer process: the upload, this rank's index on the durable root, and the commit.

:class:`DurableLevel` owns the durable root as a tier, its
:class:`~ckptio.engine.writer.step_committer.StepCommitter` (keeping ``keep_last`` steps) and its failure rule: an
upload or a durable index that fails, or a durable commit, stops this level only, and its marker goes to the
durable records; a local-level save of the same job goes on. The job pipeline hands over a save's files on the
first tier: when they are on the local tier the level uploads them (paced like every flush), then writes this
rank's index, gives the staging slot back, and queues the commit.

It never reads a staging slot (the slot is given back here only because a save without a local tier is read from
it until its files are on the durable root), and never deletes in ``local_dir`` itself (the local tier does).
"""

from __future__ import annotations

import contextlib
import time

from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.protocol import Outbox, WriterStart
from ckptio.engine.writer.first_tier import SavedFiles
from ckptio.engine.writer.flush_pacer import PacedFlush
from ckptio.engine.writer.flushes import Flushes
from ckptio.engine.writer.level_cleanup import CommittedSteps
from ckptio.engine.writer.level_outcome import Attempt, LevelOutcome
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.local_tier import LocalTier
from ckptio.engine.writer.step_committer import CommitLevel, CommitRequest, StepCommitter
from ckptio.errors import StorageError
from ckptio.format import FileRecord, RankIndex, index_key, record_key, step_dir
from ckptio.format.layout import data_file_name
from ckptio.format.rollback import delete_data_files
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import join_key


class DurableLevel:
    """One writer's part of the durable level."""

    name = "durable"

    def __init__(self, start: WriterStart, out: Outbox, live: LiveSteps, *, flushes: Flushes,
                 local_tier: LocalTier | None, markers: FailureMarkers, committed: CommittedSteps,
                 other_levels: tuple[CommittedSteps, ...] = ()) -> None:
        self.start, self.out, self.flushes, self.local_tier = start, out, flushes, local_tier
        self.storage = start.durable
        self.outcome = LevelOutcome(self.name, start, out, live, markers=markers, discard=self._discard)
        evict = local_tier.evict_below if local_tier is not None else None
        self.committer = StepCommitter(
            CommitLevel(self.name, committed, keep_last=start.config.keep_last, retire_also=other_levels,
                        after_commit=evict),
            start, out, live, outcome=self.outcome)

    def take(self, saved: SavedFiles, attempt: Attempt) -> None:
        """Upload (from the local tier), write this rank's durable index, free the slot, queue the commit."""
        job, rank = saved.job, self.start.rank
        try:
            if saved.on_local:
                with self.flushes.flush(job, "durable") as flush:
                    self._upload(saved, flush)
            index = RankIndex(step=job.step, rank=rank, world_size=self.start.world_size, save_id=job.save_id,
                              files=saved.files, items=saved.items)
            t0 = time.monotonic()
            self.storage.put(index_key(job.step, rank), index.to_json())
            self.out.event(Event.PHASE, job.step, phase=Phase.RANK_INDEX, seconds=time.monotonic() - t0, bytes=0,
                           tier="durable")
        except BaseException as exc:
            saved.slot.free()
            self.outcome.failed(attempt, exc)
            return
        saved.slot.free()
        self.committer.submit(CommitRequest(attempt=attempt, metadata_skeleton=saved.plan.metadata_skeleton,
                                            rollback=job.rollback, replaces=job.replaces))

    def _upload(self, saved: SavedFiles, flush: PacedFlush) -> None:
        assert self.local_tier is not None
        local, step = self.local_tier.storage, saved.job.step

        def upload(rec: FileRecord) -> None:
            key = join_key(step_dir(step), rec.name)  # the local tier never hashes keys
            t0 = time.monotonic()
            local.copy_to(key, self.storage, record_key(step, rec), pacer=flush.pacer)
            self.out.event(Event.PHASE, step, phase=Phase.UPLOAD, seconds=time.monotonic() - t0, bytes=rec.size,
                           tier="durable", file=rec.name)

        self.flushes.run_all(upload, saved.files)

    def _discard(self, attempt: Attempt) -> None:
        """A failed attempt's files on the durable root, and on the local tier unless the local level reads them."""
        names = [data_file_name(self.start.rank, n, attempt.save_id) for n in range(attempt.n_files)]
        with contextlib.suppress(StorageError):
            delete_data_files(self.storage, attempt.step, names)
        if self.local_tier is not None and not attempt.levels.local:
            self.local_tier.discard(attempt.step, names)

    def close(self) -> None:
        self.committer.close()
