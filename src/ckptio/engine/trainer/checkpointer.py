"""The Checkpointer: save / maybe_save / wait_staged / guard / wait / restore / latest_step / close.

``save`` runs on the training thread and does only what must happen there (``engine.trainer.save_launcher``):
decide on this rank alone (no collective on the steady path; ``engine.trainer.save_decision`` agrees the planning
saves), re-plan when the structure changed (``engine.trainer.plan_cache``), and launch the copy into a reusable
staging slot (``engine.trainer.stager``), which then goes to this rank's writer process: serialization, checksums,
writes, uploads, commit-or-drop. This class holds the collaborators, the public methods, the preemption exit and
``close``. A failed save never kills training: it is reported by ``SaveHandle.wait``, ``Checkpointer.wait``, a log
line at the next ``save``, events and metrics, and ``close()`` raises the first failure never reported (within
``close_timeout_s``). Pending saves live in ``engine.trainer.save_tracker``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, NoReturn

from ckptio import format as fmt
from ckptio._wait import bounded
from ckptio.config import CheckpointerConfig, CheckpointerOptions, resolve_config
from ckptio.engine import protocol
from ckptio.engine.owner_record import OwnerRecord
from ckptio.engine.restore.step_restore import RestoreReport
from ckptio.engine.side_group import SideGroup
from ckptio.engine.trainer import exit_guard as atexit_guard
from ckptio.engine.trainer.maybe_save_votes import MaybeSaveVotes
from ckptio.engine.trainer.pace_rule import PaceRule, ranks_on_node
from ckptio.engine.trainer.save_decision import SaveRequest
from ckptio.engine.trainer.save_handle import SaveHandle
from ckptio.engine.trainer.save_launcher import SaveLauncher
from ckptio.engine.trainer.save_levels import SingleLevel, node_identity, open_levels
from ckptio.engine.trainer.save_tracker import SaveTracker
from ckptio.engine.trainer.stager import Stager
from ckptio.engine.trainer.staging_area import StagingArea, remove_stale_slots, staging_dir
from ckptio.engine.trainer.staging_guard import StagingGuard
from ckptio.engine.trainer.step_rules import checked_step
from ckptio.engine.trainer.writer_proxy import WriterProxy
from ckptio.errors import CheckpointerClosedError, CheckpointerForkedError, CommitError, ConfigError
from ckptio.obs.events import Event, EventLog, rank_path
from ckptio.obs.metrics import SaveMetrics, start_rank_exporter
from ckptio.obs.steps import StepTimer

if TYPE_CHECKING:
    # Annotations are never evaluated at run time, so Python 3.10 (no typing.Unpack) runs this module too.
    from typing import Unpack

log = logging.getLogger("ckptio")


class Checkpointer:
    """Staged, bounded, background-flushed, atomically committed checkpoints. See ``CheckpointerConfig``.

    Where saves go and restores come from (one level, or the local level beside the durable one) is its
    ``levels`` collaborator (``engine.trainer.save_levels``). It belongs to the process that built it: in a forked
    child every public method raises :class:`~ckptio.errors.CheckpointerForkedError` at once (the writer, the
    staging thread and the slots are the parent's), except ``close()``, which does nothing there."""

    def __init__(self, root: Any = None, *, config: CheckpointerConfig | None = None, process_group: Any = None,
                 **options: Unpack[CheckpointerOptions]) -> None:
        self.config = config = resolve_config(root, config, options)
        # All or nothing: each step that holds something (side group, storage client, event file, root claim, port,
        # process) registers its undo as it succeeds; when a later step raises, the undos run in reverse and the
        # error goes on. Once built, ``_resources`` is what close() undoes.
        from ckptio.engine.trainer import preflight  # the policy modules load only when a Checkpointer does

        with contextlib.ExitStack() as undo_on_failure:
            self.group = SideGroup(process_group)
            if process_group is None:
                undo_on_failure.callback(self.group.destroy)
            self.rank, self.world_size = self.group.rank, self.group.world_size
            self.storage, self.local = preflight.open_stores(config, undo_on_failure)
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
        node_budget = config.flush_pace not in (None, "auto")  # only a node's budget needs the count: a collective
        on_node = ranks_on_node(self.group, node_identity(config.node_id)) if node_budget else 1
        pace = PaceRule(config.flush_pace, fraction=config.flush_pace_fraction, ranks_on_node=on_node,
                        every_seconds=config.every_seconds)
        self._launcher = SaveLauncher(config, group=self.group, events=self.events, staging=self._staging,
                                      stager=self._stager, tracker=self._tracker, writer=self._writer,
                                      markers=self.levels.markers, pace=pace, check_open=self._check_open)
        if config.start_writer == "on_init" or self.levels.writer_start() is not None:  # partners serve restores
            # Booting an interpreter that imports torch takes seconds: start now so it overlaps training.
            self._writer.ensure_started()

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
        return self._submit(step, state, emergency=False)

    def _submit(self, step: int, state: dict[str, Any], *, emergency: bool) -> SaveHandle:
        self._check_open()
        t0 = time.monotonic()
        save_id = self._save_ids.next()  # on every call and every rank, so that the ranks' ids stay aligned
        request = SaveRequest(checked_step(step), save_id, self.levels.job_levels(self._save_ids.count,
                                                                                  emergency=emergency), emergency)
        if not emergency and self.levels.preempted_at() is not None and not self._votes.used:
            # SIGTERM came and no maybe_save agrees it across ranks: this save becomes the emergency save, then exit.
            self._exit_preempted(request.step, state)
        self.events.emit(Event.SAVE_REQUESTED, request.step)
        self._tracker.log_unreported()
        handle = self._launcher.launch(request, state)
        if not handle.skipped:
            handle.requested_mono, handle.returned_mono = t0, time.monotonic()
            handle.blocking_s = handle.returned_mono - t0
            self.events.emit(Event.SAVE_RETURNED, request.step, blocking_s=handle.blocking_s, bytes=handle.bytes)
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
        elapsed_s = time.monotonic() - (self._launcher.last_save_mono or self._created_mono)
        time_due, preempted = self._votes.decide(elapsed_s=elapsed_s, preempted=self.levels.preempted_at() is not None)
        if preempted:
            self._exit_preempted(step, state)  # SIGTERM on any rank: the emergency save, then SystemExit(0)
        due = time_due or (self.config.every_steps is not None and step % self.config.every_steps == 0)
        return self.save(step, state) if due else None

    # ---- wait / restore / close --------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> None:
        """Block until every pending save completed; raise the first failure not reported yet (once).
        ``TimeoutError`` naming the steps if ``timeout`` passes first."""
        self._check_process()
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
        self._check_process()
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
        self._check_process()
        return StagingGuard(self._stager, optimizer, model)

    def writer_ready(self, timeout: float | None = None) -> bool:
        """Wait until this rank's writer process has booted (True), or ``timeout`` passed (False)."""
        self._check_process()
        self._writer.ensure_started()
        return self._tracker.writer_ready.wait(bounded(timeout))

    def pending_steps(self) -> list[int]:
        self._check_process()
        return self._tracker.steps()

    def pending_saves(self) -> list[SaveHandle]:
        """The handles of the saves not complete yet, by step."""
        self._check_process()
        return sorted(self._tracker.handles(), key=lambda h: h.step)

    def latest_step(self) -> int | None:
        self._check_process()
        return fmt.newest_committed_step(self.storage)

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
            self._launcher.step_rules.seen(chosen)
        return chosen

    def emergency_save(self, step: int, state: dict[str, Any]) -> SaveHandle:
        """Save ``step`` to the local level and its partners now (the durable level with ``durable_every=1``) and
        wait at most ``preempt_grace_s`` (counted from the SIGTERM, if one came) for its commit. All ranks call
        together. Returns the handle; a save that did not commit in time is reported, never raised."""
        self._check_process()
        return self.levels.emergency_save(lambda s, st: self._submit(s, st, emergency=True), step, state)

    def _exit_preempted(self, step: int, state: dict[str, Any]) -> NoReturn:
        """After a SIGTERM: the emergency save, then a clean exit within what is left of the grace period (pending
        durable uploads are abandoned: the local level holds a newer step)."""
        self.emergency_save(step, state)
        at = self.levels.preempted_at()
        left = self.config.close_timeout_s if at is None else at + self.config.preempt_grace_s - time.monotonic()
        self.close(wait=False, timeout=max(0.0, min(left, self.config.close_timeout_s)))
        raise SystemExit(0)

    def step_timer(self, step: int) -> contextlib.AbstractContextManager[None]:
        """Time one training step into the events (attributed later to staging, flush overlap, or neither)."""
        self._check_process()
        return self.steps.step(step)

    def step_begin(self, step: int) -> None:
        self._check_process()
        self.steps.begin(step)

    def step_end(self, step: int) -> float:
        self._check_process()
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

    def _check_process(self) -> None:
        """Raise at once in a forked child: what a method would wait for there (the staging thread, the writer's
        answers) does not exist in it, and what it would touch is the parent's."""
        if os.getpid() != self._pid:
            raise CheckpointerForkedError(f"built by process {self._pid}, used in its forked child {os.getpid()}: "
                                          "build a Checkpointer in the child", root=self.storage.url, rank=self.rank)

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            raise CheckpointerClosedError("checkpointer is closed", root=self.storage.url, rank=self.rank)

    def __enter__(self) -> Checkpointer:
        self._check_process()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
