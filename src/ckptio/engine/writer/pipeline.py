"""The job pipeline of one rank's writer: staging slot → data files on the first tier → each level of the save.

Per :class:`~ckptio.engine.protocol.SaveJob`, in order, on one thread: the job's *shared part* (the plan, the
residency check, and :class:`~ckptio.engine.writer.first_tier.FirstTier` serializing the slot into data files on the
local tier, else the durable root), then the job is handed to each level it goes to. The writer holds one object per
level, each owning its tier, its committer and its failure rule: :class:`~ckptio.engine.writer.durable_level.
DurableLevel` (upload, rank index, commit) and, in a two-level job only, :class:`~ckptio.engine.writer.local_level.
LocalLevel` (partner copies, rank index, commit). A single-level job has no local level object.

Failures: a failure of the shared part fails the save on every level it goes to (each level's
:class:`~ckptio.engine.writer.level_outcome.LevelOutcome` marks its own records, so the markers reach every level
the failure stops); a failure inside a level stays with that level. The process around the pipeline (message
loop, priority) is ``engine.writer.process``; the local directory's space belongs to ``engine.writer.local_tier``.

It must never touch the training process group, commit a step, or delete a committed one.
"""

from __future__ import annotations

import time
from typing import Protocol

from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.protocol import JobLevels, Outbox, SaveJob, WriterPlan, WriterStart
from ckptio.engine.writer.durable_level import DurableLevel
from ckptio.engine.writer.first_tier import FirstTier, SavedFiles, Slot
from ckptio.engine.writer.flushes import Flushes
from ckptio.engine.writer.level_cleanup import CommittedSteps
from ckptio.engine.writer.level_outcome import Attempt, LevelOutcome
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.local_level import LocalLevel
from ckptio.engine.writer.local_tier import LocalTier
from ckptio.engine.writer.step_committer import StepCommitter
from ckptio.errors import StorageError
from ckptio.format.local_level_records import local_records
from ckptio.obs.events import Event


class Level(Protocol):
    """What the pipeline needs of a level: take a job whose files are written, end an attempt, close."""

    name: str
    outcome: LevelOutcome
    committer: StepCommitter

    def take(self, saved: SavedFiles, attempt: Attempt) -> None: ...

    def close(self) -> None: ...


class Writer:
    """The body of the writer process (also driven in-process by the unit tests)."""

    def __init__(self, start: WriterStart, out: Outbox, live: LiveSteps | None = None) -> None:
        self.start, self.config, self.out = start, start.config, out
        self.live = live or LiveSteps()
        self.flushes = Flushes(out, concurrency=self.config.upload_concurrency)
        self.pacer = self.flushes.pacer
        self._plans: dict[int, WriterPlan] = {}
        self._last_residency_check = 0.0
        records = local_records(start.durable) if start.levels is not None else None
        self.local_tier = None if start.local is None else LocalTier(
            start.local, durable=start.durable, local_records=records, live=self.live,
            budget=self.config.local_capacity_bytes, rank=start.rank)
        markers = FailureMarkers(start.durable, records)
        self.first_tier = FirstTier(start, out, self.flushes, self.local_tier)
        durable = CommittedSteps(start.durable)
        local = CommittedSteps(records) if records is not None else None
        self.durable = DurableLevel(start, out, self.live, flushes=self.flushes, local_tier=self.local_tier,
                                    markers=markers, committed=durable, other_levels=(local,) if local else ())
        self.local: LocalLevel | None = None
        if local is not None:
            assert self.local_tier is not None
            self.local = LocalLevel(start, out, self.live, tier=self.local_tier, markers=markers, committed=local,
                                    durable=durable, pacer=self.pacer)

    def add_plan(self, plan: WriterPlan) -> None:
        self._plans = {plan.plan_id: plan}  # jobs are in order, so older plans are never referenced again

    def _levels(self, job: SaveJob) -> tuple[JobLevels, list[Level]]:
        """Where ``job`` goes, and those levels' objects (the local level first: its copies then run while the
        durable level uploads)."""
        if self.local is None:
            return JobLevels(), [self.durable]
        wanted = ((self.local, job.levels.local), (self.durable, job.levels.durable))
        return job.levels, [level for level, on in wanted if on]

    def run_job(self, job: SaveJob) -> None:
        """Run one save up to its levels' commit requests. ``job.step`` is live (registered by the caller, once)
        until each level reports its outcome: one more registration per further level."""
        self.pacer.job_started()
        levels, targets = self._levels(job)
        for _ in targets[1:]:
            self.live.add(job.step)
        slot = Slot(self.out, job)
        plan = self._plans.get(job.plan_id)
        attempt = Attempt(job.step, job.save_id, plan.layout.n_files if plan is not None else 0, levels)
        try:
            if plan is None:
                raise StorageError(f"no plan {job.plan_id} for this save", step=job.step, rank=self.start.rank)
            self._check_residency()
            self._wait_for_commits(job, targets)
            saved = self.first_tier.write(job, plan, slot, fallback=levels.durable)
        except BaseException as exc:
            slot.free()
            for level in targets:  # the save fails on every level it goes to, each marking its own records
                level.outcome.failed(attempt, exc)
            return
        for level in targets:
            level.take(saved, attempt)

    def _wait_for_commits(self, job: SaveJob, targets: list[Level]) -> None:
        """Back-pressure: write this save's files only once each of its levels' committers is at most
        ``max_pending`` saves behind, so no level holds more than ``max_pending`` + 1 written but uncommitted
        saves. The slot stays held meanwhile, and the trainer's ``overflow`` rule (block or skip) does the rest."""
        for level in targets:
            behind = level.committer.unfinished()
            waited = level.committer.wait_for_room(self.config.max_pending)
            if behind > self.config.max_pending:
                self.out.event(Event.COMMIT_BEHIND, job.step, level=level.name, waited_s=waited, unfinished=behind)

    def _check_residency(self) -> None:
        if self.config.residency is None:
            return
        now = time.monotonic()
        if now - self._last_residency_check < self.config.residency_recheck_s and self._last_residency_check:
            return
        from ckptio.policy.residency import check_residency

        check_residency(self.start.durable, self.config.residency)
        self._last_residency_check = now

    def close(self) -> None:
        """Finish the queued commits, then release the threads and the slot mappings."""
        self.durable.close()
        if self.local is not None:
            self.local.close()
        self.flushes.close()
        self.first_tier.close()
