"""The Checkpointer: save / maybe_save / wait_staged / guard / wait / restore / latest_step / close.

``save`` runs on the training thread and does only what must happen there: decide on this rank alone (no
collective on the steady path; ``engine.trainer.save_decision`` agrees the planning saves), re-plan when the structure
changed, and launch the copy into a reusable staging slot (``engine.trainer.stager``), which then goes to this rank's
writer process: serialization, checksums, writes, uploads, commit-or-drop. A failed save never kills training: it is
reported by ``SaveHandle.wait``, ``Checkpointer.wait``, a log line at the next ``save``, events and metrics, and
``close()`` raises the first failure never reported (within ``close_timeout_s``). Pending saves live in
``engine.trainer.save_tracker``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, NoReturn

from ckptio import format as fmt
from ckptio.config import CheckpointerConfig, CheckpointerOptions, resolve_config
from ckptio.engine import protocol
from ckptio.engine.owner_record import OwnerRecord
from ckptio.engine.protocol import JobLevels
from ckptio.engine.restore.step_restore import RestoreReport
from ckptio.engine.side_group import SideGroup
from ckptio.engine.trainer import exit_guard as atexit_guard
from ckptio.engine.trainer.levels import SingleLevel, node_identity, open_levels
from ckptio.engine.trainer.maybe_save_votes import MaybeSaveVotes
from ckptio.engine.trainer.pace_rule import PaceRule, ranks_on_node
from ckptio.engine.trainer.rank_plan import coordinated_plan, resolve_objects, resolve_tensors
from ckptio.engine.trainer.save_decision import agree_to_plan, prepare_state
from ckptio.engine.trainer.save_handle import SaveHandle
from ckptio.engine.trainer.save_tracker import SaveTracker
from ckptio.engine.trainer.stager import Stager, checked_sizes
from ckptio.engine.trainer.staging_area import StagingArea, check_fits_on_every_rank, remove_stale_slots, staging_dir
from ckptio.engine.trainer.staging_guard import StagingGuard
from ckptio.engine.trainer.step_rules import StepRules, checked_step
from ckptio.engine.trainer.writer_proxy import WriterProxy
from ckptio.errors import CheckpointerClosedError, CkptError, CommitError, ConfigError
from ckptio.format.layout import plan_layout
from ckptio.obs.events import Event, EventLog, rank_path
from ckptio.obs.metrics import SaveMetrics, start_rank_exporter
from ckptio.obs.steps import StepTimer
from ckptio.storage import PosixRoot, Storage, open_storage, parse_root

if TYPE_CHECKING:
    # Annotations are never evaluated at run time, so Python 3.10 (no typing.Unpack) runs this module too.
    from typing import Unpack

log = logging.getLogger("ckptio")


class Checkpointer:
    """Staged, bounded, background-flushed, atomically committed checkpoints. See ``CheckpointerConfig``.

    Where saves go and restores come from (one level, or the local level beside the durable one) is its
    ``levels`` collaborator (``engine.trainer.levels``)."""

    def __init__(self, root: Any = None, *, config: CheckpointerConfig | None = None, process_group: Any = None,
                 **options: Unpack[CheckpointerOptions]) -> None:
        self.config = config = resolve_config(root, config, options)
        # All or nothing: each step that holds something (side group, storage client, event file, root claim, port,
        # process) registers its undo as it succeeds; when a later step raises, the undos run in reverse and the
        # error goes on. Once built, ``_resources`` is what close() undoes.
        with contextlib.ExitStack() as undo_on_failure:
            self.group = SideGroup(process_group)
            if process_group is None:
                undo_on_failure.callback(self.group.destroy)
            self.rank, self.world_size = self.group.rank, self.group.world_size
            self.storage: Storage = open_storage(config.root, **self._storage_options())
            if not isinstance(config.root, Storage):  # a Storage the caller passed is the caller's to close
                undo_on_failure.callback(self.storage.close)
            self.local: Storage | None = None
            if config.local_dir is not None:
                self.local = open_storage(config.local_dir, fsync=False)
                if not isinstance(config.local_dir, Storage):
                    undo_on_failure.callback(self.local.close)
            self._resources = undo_on_failure.enter_context(contextlib.ExitStack())
            self._init_state()
            self._acquire()
            undo_on_failure.pop_all()

    # ---- construction helpers -----------------------------------------------------------------------------------
    def _init_state(self) -> None:
        """Plain attributes, set before the writer can call back into this object."""
        self._owner: OwnerRecord | None = None
        self._exporter: Any = None
        self._close_deadline: float | None = None
        self._plan_key: int | None = None
        self._fast_flatten, self._plan_id = True, 0
        self._tensor_items: list[Any] = []
        self._object_items: list[Any] = []
        self._layout: Any = None
        self._last_save_mono: float | None = None
        self._created_mono = time.monotonic()
        self._closed = False
        self._pid = os.getpid()
        self.last_restore: RestoreReport | None = None
        """What the last ``restore`` read: the step, the level, the files per source, and why (``note``)."""

    def _acquire(self) -> None:
        """Event log, root claim, metrics, staging, writer: in the order close() undoes in reverse. Checks that hold
        nothing run before the root claim; the writer (seconds to boot and to stop) starts last, after every step
        that can fail."""
        config, resources = self.config, self._resources
        self.events = EventLog(rank_path(config.events_path, self.rank) if config.events_path else None,
                               rank=self.rank, role="trainer")
        resources.callback(self.events.close)
        self.steps = StepTimer(self.events)
        from ckptio.engine.trainer.preflight import preflight  # the policy modules load only when a Checkpointer does

        self._owner, self._save_ids = preflight(self.storage, config, self.group, resources)
        self._metrics = self._start_metrics()
        slots_dir = staging_dir(config.staging_dir)
        remove_stale_slots(slots_dir)
        self._staging = StagingArea(config.max_pending, slots_dir)
        resources.callback(self._staging.close)
        # Every rank together: a two-level job exchanges its partner servers' addresses on the side group.
        self.levels: SingleLevel = open_levels(config, group=self.group, storage=self.storage, local=self.local,
                                               events=self.events)
        resources.callback(self.levels.close)
        self._tracker = SaveTracker(self.events, self._staging, self.storage, self.rank, markers=self.levels.markers)
        node_budget = config.flush_pace not in (None, "auto")  # only a node's budget needs the count: a collective
        on_node = ranks_on_node(self.group, node_identity(config.node_id)) if node_budget else 1
        self._pace = PaceRule(config.flush_pace, fraction=config.flush_pace_fraction, ranks_on_node=on_node,
                              every_seconds=config.every_seconds)
        self._votes = MaybeSaveVotes(self.group, every_seconds=config.every_seconds, timeout_s=config.commit_timeout_s,
                                     watch_preemption=self.levels.watch_preemption)
        resources.callback(self._votes.drain)
        self._writer = WriterProxy(self._writer_spec(), on_message=self._tracker.on_message,
                                   on_death=lambda code: self._tracker.on_writer_death(code, self._writer.pid))
        resources.callback(self._stop_writer)
        self._stager = Stager(config.staging, self.events, self._tracker, writer=self._writer,
                              markers=self.levels.markers, rank=self.rank)
        resources.callback(self._stager.close)  # before the writer stops: queued copies still reach it
        resources.callback(atexit_guard.register(self))  # exit without close(): finish in-flight saves, say so
        self._step_rules = StepRules(self._tracker, self._writer, rank=self.rank, root=self.storage.url,
                                pending_wait_s=config.close_timeout_s, ack_wait_s=config.commit_timeout_s)
        if config.start_writer == "on_init" or self.levels.writer_start() is not None:  # partners serve restores
            # Booting an interpreter that imports torch takes seconds: start now so it overlaps training.
            self._writer.ensure_started()

    def _storage_options(self) -> dict[str, Any]:
        opts = dict(self.config.storage_options)
        if isinstance(self.config.root, (str, os.PathLike)) and isinstance(parse_root(self.config.root), PosixRoot):
            opts.setdefault("fsync", self.config.fsync)
        return opts

    def _writer_spec(self) -> protocol.WriterStart:
        return protocol.WriterStart(config=self.config.writer_config(), rank=self.rank, world_size=self.world_size,
                                    durable=self.storage, local=self.local, owner=self._owner,
                                    levels=self.levels.writer_start())

    def _start_metrics(self) -> SaveMetrics:
        metrics = SaveMetrics(self.config.metrics_registry, rank=self.rank)
        self.events.add_listener(metrics.observe)
        self._exporter = start_rank_exporter(self.config.metrics_port, self.rank, host=self.config.metrics_host,
                                             registry=self.config.metrics_registry)
        if self._exporter is not None:
            self._resources.callback(self._exporter.close)
        return metrics

    # ---- save --------------------------------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> SaveHandle:
        """Decide, launch the copy of ``state`` into a staging slot, and return. All ranks call together.

        With ``staging="async"`` (default) the copy runs after ``save`` returns: mutate ``state`` only once it is
        staged — ``guard(optimizer, model)`` makes that automatic, else call ``wait_staged()`` first. ``step`` is
        an int >= 0 (else ConfigError, and the writer is untouched). Saving a step again supersedes it: this call
        first waits for a pending save of the same step, and the step then holds the later state.
        """
        self._check_open()
        t0 = time.monotonic()
        save_id = self._save_ids.next()  # on every call and every rank, so that the ranks' ids stay aligned
        levels = self.levels.job_levels(self._save_ids.count)
        step = checked_step(step)
        if self.levels.preempted_at() is not None and not (self.levels.emergency or self._votes.used):
            # SIGTERM came and no maybe_save agrees it across ranks: this save becomes the emergency save, then exit.
            self._exit_preempted(step, state)
        self.events.emit(Event.SAVE_REQUESTED, step)
        self._tracker.log_unreported()
        local_error, reserved = self._step_rules.before_agreement(step)
        try:
            handle = self._save(step, state, save_id, levels, local_error)
        finally:
            if reserved:  # released once the job (queued on the staging thread) holds the step in the writer
                self._stager.after(lambda: self._step_rules.after_agreement(step, True))
        if not handle.skipped:
            handle.requested_mono, handle.returned_mono = t0, time.monotonic()
            handle.blocking_s = handle.returned_mono - t0
            self.events.emit(Event.SAVE_RETURNED, step, blocking_s=handle.blocking_s, bytes=handle.bytes)
        return handle

    def _save(self, step: int, state: dict[str, Any], save_id: int, levels: JobLevels,
              local_error: CkptError | None) -> SaveHandle:
        state_dict: Any = None
        flat: dict[str, Any] = {}
        key: int | None = None
        if local_error is None:
            state_dict, flat, key, local_error = prepare_state(state, plan_key=self._plan_key,
                                                               fast=self._fast_flatten, rank=self.rank)
        if self._plan_key is None or (key is not None and key != self._plan_key):
            return self._planning_save(step, (state_dict, flat, key), save_id, levels, local_error)
        # The steady path: no collective. Whatever this rank decides alone, it leaves a drop marker for the others.
        t0 = time.monotonic()
        if local_error is not None or self._tracker.writer_error is not None:
            self._stager.drop(step, save_id, f"rank {self.rank} refused the save", levels)
            self._raise_local(step, local_error)
        if self._staging.free_slot_id() is None:
            self._stager.after(self._writer.hurry)  # a paced flush holds the slot: full speed now
            if self.config.overflow == "skip":
                self._stager.drop(step, save_id, f"rank {self.rank} had no free staging slot", levels)
                return self._skipped(step, "no free staging slot")
            while not self._staging.wait_free(timeout=1.0):
                self._check_open()
        self.events.emit(Event.SAVE_AGREED, step, blocked_s=time.monotonic() - t0, pending=self._staging.pending())
        return self._stage(step, flat, save_id, levels)

    def _planning_save(self, step: int, prepared: tuple[Any, dict[str, Any], int | None], save_id: int,
                       levels: JobLevels, local_error: CkptError | None) -> SaveHandle:
        """The first save and a structure change plan collectively, so they are agreed collectively too."""
        t0 = time.monotonic()
        if self._staging.free_slot_id() is None:
            self._stager.after(self._writer.hurry)  # a paced flush holds the slot: full speed now
        try:
            agreed = agree_to_plan(self.group, self._staging, step=step, timeout_s=self.config.commit_timeout_s,
                                   overflow=self.config.overflow,
                                   error=local_error is not None or self._tracker.writer_error is not None)
        except ConfigError:
            self._stager.drop(step, save_id, f"rank {self.rank} planned alone", levels)
            raise
        if agreed.any_error:
            self._raise_local(step, local_error)
            return self._skipped(step, "another rank reported an error", reason="error on a rank")
        if not agreed.all_free:
            return self._skipped(step, "no free staging slot")
        self.events.emit(Event.SAVE_AGREED, step, blocked_s=time.monotonic() - t0, pending=self._staging.pending())
        return self._stage(step, self._replan(*prepared), save_id, levels)

    def _skipped(self, step: int, why: str, *, reason: str | None = None) -> SaveHandle:
        self.events.emit(Event.SAVE_SKIPPED, step, reason=reason or why, pending=self._staging.pending())
        return SaveHandle(step, skipped=True, skip_reason=why)

    def _raise_local(self, step: int, local_error: CkptError | None) -> None:
        """Raise this rank's own reason to give a save up: a dead writer (restarted first) or a bad state."""
        self.events.emit(Event.SAVE_SKIPPED, step, reason="error on a rank", pending=self._staging.pending())
        if self._tracker.writer_error is not None:
            error, self._tracker.writer_error = self._tracker.writer_error, None
            self._writer.forget()
            self._writer.start()  # recover: the next save goes to a fresh writer
            raise error
        if local_error is not None:
            local_error.step = step
            local_error.rank = self.rank
            raise local_error

    def _replan(self, state_dict: dict[str, Any], flat: dict[str, Any], key: int | None) -> dict[str, Any]:
        """DCP global planning (dedup across ranks) once per structure, through rank 0 as coordinator. Returns the
        flat state to stage from (DCP's own, should the quick flattening ever disagree with it). Raises before
        anything is staged when the staging slots cannot fit."""
        plan = coordinated_plan(state_dict, flat, self.group)
        if plan.flattening_differed:
            log.warning("ckptio: state flattening differs from DCP's; using DCP's (slower) from now on")
            self._fast_flatten = False
        layout = plan_layout(self.rank, plan.tensor_items + plan.object_items, self.config.file_size_bytes)
        check_fits_on_every_rank(self._staging, layout, self.group)
        self._tensor_items, self._object_items, self._layout = plan.tensor_items, plan.object_items, layout
        self._plan_key = key
        self._plan_id += 1
        self._writer.ensure_started()
        message = protocol.WriterPlan(self._plan_id, layout, metadata_skeleton=plan.metadata_skeleton)
        self._stager.after(lambda: self._writer.send_plan(message))  # after the jobs of the previous plan
        return plan.flat

    def _stage(self, step: int, flat: dict[str, Any], save_id: int, levels: JobLevels) -> SaveHandle:
        slot_id = self._staging.free_slot_id()
        assert slot_id is not None  # checked free above; only this thread acquires slots
        handle = SaveHandle(step, slot_id=slot_id, save_id=save_id)
        self._step_rules.seen(step)
        last, self._last_save_mono = self._last_save_mono, time.monotonic()
        handle.interval_s = self._last_save_mono - last if last is not None else None
        slot = self._staging.acquire(slot_id, self._layout)
        try:
            tensors = resolve_tensors(flat, self._tensor_items)
            handle.bytes = checked_sizes(slot, tensors)
            objects = resolve_objects(flat, self._object_items)  # pickled now: objects are not guarded
        except BaseException as exc:
            self._staging.release(slot_id)
            # The other ranks are saving this step: tell their writers it cannot commit.
            self.levels.markers.mark(levels, step, f"rank{self.rank}", save_id, exc)
            raise
        rollback, replaces = self._tracker.job_rules(handle)
        self._tracker.add(handle, levels)
        self._pace.observe(handle.interval_s)
        pace = None if self.levels.emergency else self._pace.rate(handle.bytes)  # an emergency save never waits
        job = protocol.SaveJob(step=step, save_id=save_id, slot_id=slot_id, slot_path=slot.path,
                               slot_nbytes=slot.nbytes, plan_id=self._plan_id, objects=tuple(objects),
                               rollback=rollback, replaces=replaces, levels=levels, pace_bytes_per_s=pace)
        self._writer.ensure_started()
        self._stager.stage(handle, slot, tensors, job)
        return handle

    def maybe_save(self, step: int, state: dict[str, Any]) -> SaveHandle | None:
        """Save when ``every_steps`` divides ``step`` or ``every_seconds`` passed (rank 0's clock decides; the save
        comes two calls after it passed, so that every rank agrees without a blocking collective). Call it at the
        same steps on every rank. ConfigError when neither is configured, or for a step that is not an int >= 0."""
        self._check_open()
        if self.config.every_steps is None and self.config.every_seconds is None:
            raise ConfigError("maybe_save needs every_steps or every_seconds (or call save)", root=self.storage.url,
                              rank=self.rank)
        step = checked_step(step)
        # Agreed without blocking (engine.trainer.maybe_save_votes): the decisions land on every rank at the same call,
        # 2 calls late.
        elapsed_s = time.monotonic() - (self._last_save_mono or self._created_mono)
        time_due, preempted = self._votes.decide(elapsed_s=elapsed_s, preempted=self.levels.preempted_at() is not None)
        if preempted:
            self._exit_preempted(step, state)  # SIGTERM on any rank: the emergency save, then SystemExit(0)
        due = time_due or (self.config.every_steps is not None and step % self.config.every_steps == 0)
        return self.save(step, state) if due else None

    # ---- wait / restore / close --------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> None:
        """Block until every pending save completed; raise the first failure not reported yet (once).
        ``TimeoutError`` naming the steps if ``timeout`` passes first."""
        if not self._tracker.wait_until(None if timeout is None else time.monotonic() + timeout):
            raise TimeoutError(f"saves of steps {self._tracker.steps()} not complete within {timeout} s")
        failures = self._tracker.take_unreported()
        if not failures and self._tracker.writer_error is not None:
            failures = [self._tracker.writer_error]
        if failures:
            raise failures[0]

    def wait_staged(self, timeout: float | None = None) -> None:
        """Block until every save launched so far is staged (the state may be mutated after this); raise the first
        staging error not raised here yet. ``TimeoutError`` if ``timeout`` passes first."""
        if not self._stager.wait_idle(timeout):
            raise TimeoutError(f"staging not complete within {timeout} s")
        error = self._stager.take_error()
        if error is not None:
            raise error

    def guard(self, optimizer: Any = None, model: Any = None) -> StagingGuard:
        """Make the state's first mutation after a save wait until the save is staged, through hooks: a step
        pre-hook on ``optimizer`` (one or a list), and forward pre-hooks on the modules of ``model`` (one or a list
        of parts) that own buffers (BatchNorm and the like: the wait applies while the module is in training
        mode). Mutations elsewhere (in-place edits outside ``optimizer.step``/``forward``) still need
        ``wait_staged()``. Returns a handle whose ``remove()`` takes the hooks off (also a context manager)."""
        return StagingGuard(self._stager, optimizer, model)

    def writer_ready(self, timeout: float | None = None) -> bool:
        """Wait until this rank's writer process has booted (True), or ``timeout`` passed (False)."""
        self._writer.ensure_started()
        return self._tracker.writer_ready.wait(timeout)

    def pending_steps(self) -> list[int]:
        return self._tracker.steps()

    def latest_step(self) -> int | None:
        steps = fmt.committed_steps(self.storage)
        return steps[-1] if steps else None

    def restore(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest committed step (or ``step``) into ``state`` in place; None when there is none.

        Training continues from the restored step: the first save above it that commits retires the committed
        steps above it that this Checkpointer did not save since (rollback), so ``latest``, ``ls`` and
        ``restore()`` follow the new trajectory.
        """
        self._check_open()
        if step is not None:
            step = checked_step(step)
        self._stager.wait_idle()  # a copy still reading the state must finish before restore overwrites it
        self.last_restore = self.levels.restore(state, step)
        chosen = self.last_restore.step
        if chosen is not None:
            self._tracker.restored(chosen)
            self._step_rules.seen(chosen)
        return chosen

    def emergency_save(self, step: int, state: dict[str, Any]) -> SaveHandle:
        """Save ``step`` to the local level and its partners now (the durable level with ``durable_every=1``) and
        wait at most ``preempt_grace_s`` (counted from the SIGTERM, if one came) for its commit. All ranks call
        together. Returns the handle; a save that did not commit in time is reported, never raised."""
        return self.levels.emergency_save(self.save, step, state)

    def _exit_preempted(self, step: int, state: dict[str, Any]) -> NoReturn:
        """After a SIGTERM: the emergency save, then a clean exit (pending durable uploads are abandoned: the
        local level holds a newer step)."""
        self.emergency_save(step, state)
        self.close(wait=False)
        raise SystemExit(0)

    def step_timer(self, step: int) -> contextlib.AbstractContextManager[None]:
        """Time one training step into the events (attributed later to staging, flush overlap, or neither)."""
        return self.steps.step(step)

    def step_begin(self, step: int) -> None:
        self.steps.begin(step)

    def step_end(self, step: int) -> float:
        return self.steps.end(step)

    def close(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Finish pending saves, stop the writer, free the staging memory; then raise the first failed save never
        reported. After ``timeout`` (default ``close_timeout_s``) the writer is killed and the saves still pending
        fail with a CommitError naming them (``wait=False``: the writer alone gets that long to finish)."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # a forked child's copy: the writer, the slots and the root claim are its parent's to release
        limit = self.config.close_timeout_s if timeout is None else float(timeout)
        self._close_deadline = time.monotonic() + limit
        self._stager.after(self._writer.hurry)  # the saves close() waits for go at full speed, queued ones too
        try:
            if wait:
                self._tracker.wait_until(self._close_deadline)
        finally:
            # The reverse of construction: writer, staging, metrics endpoint, root claim, event log. Each runs even
            # when an earlier one raises.
            self._resources.close()
        failures = self._tracker.take_unreported()
        for extra in failures[1:]:
            log.error("ckptio: another save failed: %s: %s", type(extra).__name__, extra)
        if failures:
            raise failures[0]

    def _stop_writer(self) -> None:
        """Stop the writer within what is left of close()'s bound; fail what it leaves pending."""
        deadline = self._close_deadline or time.monotonic() + self.config.close_timeout_s
        clean = self._writer.stop(timeout=max(0.0, deadline - time.monotonic()))
        steps = self._tracker.steps()
        if steps:
            how = "stopped" if clean else "killed"
            self._tracker.fail_all(CommitError, f"close() gave up on steps {steps} (bound reached); the writer was "
                                                f"{how} before they committed")

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointerClosedError("checkpointer is closed", root=self.storage.url, rank=self.rank)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
