"""The trainer's book of saves in flight: the writer's replies, its death, failures not yet reported, rollback.

Saves are keyed by ``save_id``, never by step: one step may be saved twice (the later save supersedes the earlier,
see ``format.rollback``), and each handle completes with its own save's outcome. Replies arrive on the writer
reader thread; everything here is guarded by one lock. A failure is *reported* once it reached the caller — raised
by ``SaveHandle.wait``/``Checkpointer.wait``/``close`` or logged by a later ``save`` — and ``close()`` raises the
first failure that never did. This module decides nothing about steps and runs no collective.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ckptio._wait import bounded
from ckptio.engine import protocol
from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.trainer.save_handle import SaveHandle
from ckptio.errors import CkptError, WriterDiedError
from ckptio.obs.events import Event, EventLog

if TYPE_CHECKING:
    from ckptio.engine.trainer.staging_area import StagingArea
    from ckptio.storage.base import Storage

log = logging.getLogger("ckptio")
_REMEMBERED_STEPS = 1024
_IDS_PER_STEP = 8


class SaveTracker:
    """Pending handles, failures to report, the writer's readiness, and the rollback rule in force."""

    def __init__(self, events: EventLog, staging: StagingArea, storage: Storage, rank: int, *,
                 markers: FailureMarkers | None = None) -> None:
        self.events, self.staging, self.storage, self.rank = events, staging, storage, rank
        self.markers = markers or FailureMarkers(storage)
        """Where a failure marker goes when this rank's saves fail here (a save pending on either level must end
        on the other ranks at once, not at their commit timeout)."""
        self.lock = threading.Lock()
        self._pending: dict[int, SaveHandle] = {}
        self._levels: dict[int, protocol.JobLevels] = {}  # save_id -> the levels a pending save goes to
        self._failed: list[SaveHandle] = []
        self.writer_error: WriterDiedError | None = None
        self.writer_ready = threading.Event()
        self.reserved = threading.Condition(self.lock)
        self._reserved_steps: set[int] = set()
        self.rollback_above: int | None = None
        self._since_restore: list[int] = []
        self._saved_ids: dict[int, tuple[int, ...]] = {}  # step -> save ids submitted, newest steps only

    # ---- bookkeeping on the training thread -------------------------------------------------------------------
    def add(self, handle: SaveHandle, levels: protocol.JobLevels) -> None:
        with self.lock:
            self._pending[handle.save_id] = handle
            self._levels[handle.save_id] = levels

    def handles(self) -> list[SaveHandle]:
        with self.lock:
            return list(self._pending.values())

    def steps(self) -> list[int]:
        with self.lock:
            return sorted({h.step for h in self._pending.values()})

    def wait_until(self, deadline: float | None) -> bool:
        """Wait for the pending saves until ``deadline`` (monotonic); True when none is left."""
        for handle in self.handles():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not handle.wait_done(remaining):
                return False
        return not self.handles()

    def pending_for_step(self, step: int) -> SaveHandle | None:
        with self.lock:
            return next((h for h in self._pending.values() if h.step == step), None)

    def restored(self, step: int) -> None:
        """``restore`` loaded ``step``: saves above it retire the abandoned trajectory until one commits."""
        with self.lock:
            self.rollback_above, self._since_restore = step, []

    def job_rules(self, handle: SaveHandle) -> tuple[protocol.Rollback | None, tuple[int, ...]]:
        """For a save about to be submitted: the rollback rule (None when no restore waits for a commit), and the
        save ids of this Checkpointer's earlier saves of the step (whose manifest it supersedes)."""
        with self.lock:
            replaces = self._saved_ids.pop(handle.step, ())
            self._saved_ids[handle.step] = (*replaces, handle.save_id)[-_IDS_PER_STEP:]
            if len(self._saved_ids) > _REMEMBERED_STEPS:  # bounded: a step saved again after 1024 others is refused
                del self._saved_ids[next(iter(self._saved_ids))]
            if self.rollback_above is None:
                return None, replaces
            self._since_restore.append(handle.save_id)
            handle.rolls_back = handle.step > self.rollback_above
            return protocol.Rollback(above=self.rollback_above, own_save_ids=tuple(self._since_restore)), replaces

    def wait_reserved(self, step: int, timeout: float) -> bool:
        with self.reserved:
            ok = self.reserved.wait_for(lambda: step in self._reserved_steps, bounded(timeout))
            self._reserved_steps.discard(step)
            return ok

    def take_unreported(self) -> list[BaseException]:
        """Failures that never reached the caller, oldest first; they count as reported from now on."""
        with self.lock:
            failed, self._failed = self._failed, []
        errors = []
        for handle in failed:
            if not handle._reported and handle.error is not None:
                handle._reported = True
                errors.append(handle.error)
        return errors

    def log_unreported(self) -> None:
        for exc in self.take_unreported():
            log.warning("ckptio: an earlier save failed: %s: %s", type(exc).__name__, exc)

    # ---- the writer's replies (reader thread) ------------------------------------------------------------------
    def on_message(self, msg: protocol.FromWriter) -> None:
        match msg:
            case protocol.WriterEvent(record=record):
                if record.get("event") == Event.WRITER_STARTED:
                    self.writer_ready.set()
                self.events.record(record)
            case protocol.Reserved(step=step):
                with self.reserved:
                    self._reserved_steps.add(step)
                    self.reserved.notify_all()
            case protocol.SlotFree(step=step, save_id=save_id, slot_id=slot_id):
                self._release_slot(save_id, slot_id)
                self.events.emit(Event.QUEUE, step, pending=self.staging.pending())
            case protocol.SaveDone(save_id=save_id):
                self.complete(save_id, None)
            case protocol.SaveFailed(save_id=save_id, error=error):
                self.complete(save_id, error)
            case protocol.SaveDropped(save_id=save_id, reason=reason):
                self.complete(save_id, None, dropped=reason)

    def staging_finished(self, handle: SaveHandle) -> bool:
        """The staging thread is done copying ``handle``'s snapshot. True when the save is still pending (submit
        it, then mark it staged); False when it completed meanwhile (its slot is given back here)."""
        with self.lock:
            handle.copied = True
            if handle.save_id in self._pending:
                return True
            slot_id, handle.slot_id = handle.slot_id, None
        if slot_id is not None:
            self.staging.release(slot_id)
        return False

    def _release_slot(self, save_id: int, slot_id: int) -> None:
        with self.lock:  # once: a save that completed already gave its slot back then
            handle = self._pending.get(save_id)
            if handle is None or handle.slot_id != slot_id:
                return
            handle.slot_id = None
        self.staging.release(slot_id)

    def complete(self, save_id: int, error: BaseException | None, *, dropped: str | None = None) -> None:
        with self.lock:
            handle = self._pending.pop(save_id, None)
            self._levels.pop(save_id, None)
            if handle is None:
                return
            if error is not None:
                self._failed.append(handle)
            elif handle.rolls_back and dropped is None:
                self.rollback_above, self._since_restore = None, []  # the abandoned steps are retired
            # A copy still running owns its slot: the staging thread gives it back (``staging_finished``).
            slot_id, handle.slot_id = (handle.slot_id, None) if handle.copied else (None, handle.slot_id)
        if slot_id is not None:
            self.staging.release(slot_id)
        now = time.monotonic()
        if dropped is not None:
            # The same event a local skip emits, so metrics and reports count it on every rank alike.
            self.events.emit(Event.SAVE_SKIPPED, handle.step, reason=f"dropped: {dropped}", dropped=True,
                             pending=self.staging.pending())
        elif error is None:
            self.events.emit(Event.COMMITTED, handle.step, flush_s=now - handle.returned_mono, bytes=handle.bytes,
                             lag_s=now - handle.requested_mono, interval_s=handle.interval_s)
        else:
            self.events.emit(Event.SAVE_FAILED, handle.step, error=str(error), error_type=type(error).__name__)
        handle._finish(error, dropped=dropped)

    def fail_all(self, error_for: type[CkptError], message: str) -> None:
        """Fail every pending save (the writer died or was killed); tell the other ranks' writers at once."""
        for handle in self.handles():
            error = error_for(message, root=self.storage.url, step=handle.step, rank=self.rank)
            # The committer (and the other ranks) learn it now instead of waiting for their timeout; nothing of
            # the save was written by this rank's writer, so it stops every level the save goes to.
            levels = self._levels.get(handle.save_id, protocol.JobLevels())
            self.markers.mark(levels, handle.step, f"rank{self.rank}", handle.save_id, error)
            self.complete(handle.save_id, error)

    def on_writer_death(self, exitcode: int | None, pid: int | None) -> None:
        self.writer_ready.clear()
        error = WriterDiedError(f"writer process exited with code {exitcode}", root=self.storage.url, rank=self.rank)
        self.events.emit(Event.WRITER_DIED, None, pid=pid, exitcode=exitcode)
        with self.lock:
            self.writer_error = error
        self.fail_all(WriterDiedError, f"writer process exited with code {exitcode}")
