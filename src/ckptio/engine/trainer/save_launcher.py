"""One ``save`` on the training thread, from the request to a launched copy: decide, plan when the structure
changed, and hand the copy to the staging thread.

The steady path decides on this rank alone (no collective): a rank that cannot save (a bad state, a dead writer, no
free slot with ``overflow="skip"``) leaves a drop marker, so the other ranks' writers drop the step at once instead
of waiting for this rank's files. A *planning* save (the first one, or a structure change) is agreed with every rank
first (``save_decision``), then planned with every rank (``plan_cache``). Either way, what reaches the writer is one
``SaveJob`` per save, queued behind the copy into its slot (``stager``).

Whether a save happens at all after a SIGTERM, and when ``maybe_save`` saves, is the Checkpointer's: this object
only carries a request out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ckptio.config import CheckpointerConfig
from ckptio.engine import protocol
from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.side_group import SideGroup
from ckptio.engine.trainer.pace_rule import PaceRule
from ckptio.engine.trainer.plan_cache import PlanCache, PreparedState
from ckptio.engine.trainer.save_decision import SaveRequest, agree_to_plan
from ckptio.engine.trainer.save_handle import SaveHandle
from ckptio.engine.trainer.save_tracker import SaveTracker
from ckptio.engine.trainer.stager import Stager, checked_sizes
from ckptio.engine.trainer.staging_area import StagingArea
from ckptio.engine.trainer.step_rules import StepRules
from ckptio.engine.trainer.writer_proxy import WriterProxy
from ckptio.errors import CkptError, ConfigError
from ckptio.obs.events import Event, EventLog


class SaveLauncher:
    """The training thread's half of a save. Holds the plan cache, the pace rule and the time of the last save;
    the staging area, the stager, the tracker and the writer proxy are the Checkpointer's, shared."""

    def __init__(self, config: CheckpointerConfig, *, group: SideGroup, events: EventLog, staging: StagingArea,
                 stager: Stager, tracker: SaveTracker, writer: WriterProxy, markers: FailureMarkers, pace: PaceRule,
                 check_open: Callable[[], None]) -> None:
        self.config, self.group, self.rank, self.events = config, group, group.rank, events
        self.staging, self.stager, self.tracker, self.writer = staging, stager, tracker, writer
        self.markers, self.pace, self.check_open = markers, pace, check_open
        self.step_rules = StepRules(tracker, writer, rank=group.rank, root=tracker.storage.url,
                                    pending_wait_s=config.close_timeout_s, ack_wait_s=config.commit_timeout_s)
        self.plans = PlanCache(rank=group.rank, group=group, file_size_bytes=config.file_size_bytes)
        self.last_save_mono: float | None = None
        """``time.monotonic()`` when the last save was staged (None before the first)."""

    def launch(self, request: SaveRequest, state: dict[str, Any]) -> SaveHandle:
        """Carry ``request`` out: a handle (skipped, or staging), or this rank's own error raised (after a drop
        marker). The step's own rules (``step_rules``) come first; a reason they find gives the save up like a bad
        state's."""
        local_error, reserved = self.step_rules.before_agreement(request.step)
        try:
            return self._launch(request, state, local_error)
        finally:
            if reserved:  # released once the job (queued on the staging thread) holds the step in the writer
                self.stager.after(lambda: self.step_rules.after_agreement(request.step, True))

    def _launch(self, request: SaveRequest, state: dict[str, Any], local_error: CkptError | None) -> SaveHandle:
        prepared = self.plans.prepare(state) if local_error is None else PreparedState(None, {}, None, local_error)
        if self.plans.needs_plan(prepared):
            return self._planning_save(request, prepared)
        # The steady path: no collective. Whatever this rank decides alone, it leaves a drop marker for the others.
        t0 = time.monotonic()
        if prepared.error is not None or self.tracker.writer_error is not None:
            self.stager.drop(request.step, request.save_id, f"rank {self.rank} refused the save", request.levels)
            self._raise_local(request.step, prepared.error)
        if self.staging.free_slot_id() is None:
            self.stager.after(self.writer.hurry)  # a paced flush holds the slot: full speed now
            if self.config.overflow == "skip":
                self.stager.drop(request.step, request.save_id, f"rank {self.rank} had no free staging slot",
                                 request.levels)
                return self._skipped(request.step, "no free staging slot")
            while not self.staging.wait_free(timeout=1.0):
                self.check_open()
        self.events.emit(Event.SAVE_AGREED, request.step, blocked_s=time.monotonic() - t0,
                         pending=self.staging.pending())
        return self._stage(request, prepared.flat)

    def _planning_save(self, request: SaveRequest, prepared: PreparedState) -> SaveHandle:
        """The first save and a structure change plan collectively, so they are agreed collectively too."""
        t0, step = time.monotonic(), request.step
        if self.staging.free_slot_id() is None:
            self.stager.after(self.writer.hurry)  # a paced flush holds the slot: full speed now
        try:
            agreed = agree_to_plan(self.group, self.staging, step=step, timeout_s=self.config.commit_timeout_s,
                                   overflow=self.config.overflow,
                                   error=prepared.error is not None or self.tracker.writer_error is not None)
        except ConfigError:
            self.stager.drop(step, request.save_id, f"rank {self.rank} planned alone", request.levels)
            raise
        if agreed.any_error:
            self._raise_local(step, prepared.error)
            return self._skipped(step, "another rank reported an error", reason="error on a rank")
        if not agreed.all_free:
            return self._skipped(step, "no free staging slot")
        self.events.emit(Event.SAVE_AGREED, step, blocked_s=time.monotonic() - t0, pending=self.staging.pending())
        flat, plan = self.plans.replan(prepared, self.staging)
        self.writer.ensure_started()
        self.stager.after(lambda: self.writer.send_plan(plan))  # after the jobs of the previous plan
        return self._stage(request, flat)

    def _skipped(self, step: int, why: str, *, reason: str | None = None) -> SaveHandle:
        self.events.emit(Event.SAVE_SKIPPED, step, reason=reason or why, pending=self.staging.pending())
        return SaveHandle(step, skipped=True, skip_reason=why)

    def _raise_local(self, step: int, local_error: CkptError | None) -> None:
        """Raise this rank's own reason to give a save up: a dead writer (restarted first) or a bad state."""
        self.events.emit(Event.SAVE_SKIPPED, step, reason="error on a rank", pending=self.staging.pending())
        if self.tracker.writer_error is not None:
            error, self.tracker.writer_error = self.tracker.writer_error, None
            self.writer.forget()
            self.writer.start()  # recover: the next save goes to a fresh writer
            raise error
        if local_error is not None:
            local_error.step = step
            local_error.rank = self.rank
            raise local_error

    def _stage(self, request: SaveRequest, flat: dict[str, Any]) -> SaveHandle:
        slot_id = self.staging.free_slot_id()
        assert slot_id is not None and self.plans.layout is not None  # free and planned: checked above
        handle = SaveHandle(request.step, slot_id=slot_id, save_id=request.save_id)
        self.step_rules.seen(request.step)
        last, self.last_save_mono = self.last_save_mono, time.monotonic()
        handle.interval_s = self.last_save_mono - last if last is not None else None
        slot = self.staging.acquire(slot_id, self.plans.layout)
        try:
            items = self.plans.items(flat)
            handle.bytes = checked_sizes(slot, items.tensors)
        except BaseException as exc:
            self.staging.release(slot_id)
            # The other ranks are saving this step: tell their writers it cannot commit.
            self.markers.mark(request.levels, request.step, f"rank{self.rank}", request.save_id, exc)
            raise
        rollback, replaces = self.tracker.job_rules(handle)
        self.tracker.add(handle, request.levels)
        self.pace.observe(handle.interval_s)
        pace = None if request.emergency else self.pace.rate(handle.bytes)  # an emergency save never waits
        job = protocol.SaveJob(step=request.step, save_id=request.save_id, slot_id=slot_id, slot_path=slot.path,
                               slot_nbytes=slot.nbytes, plan_id=self.plans.plan_id, objects=tuple(items.objects),
                               rollback=rollback, replaces=replaces, levels=request.levels, pace_bytes_per_s=pace)
        self.writer.ensure_started()
        self.stager.stage(handle, slot, items.tensors, job)
        return handle
