"""``SaveHandle``: what ``Checkpointer.save`` returns — skipped now, or staged, then committed/dropped/failed later.

Two phases, two waits: ``wait_staged`` returns once the staging slot holds the snapshot (the state may be mutated
from then on), ``wait`` once the save committed. The staging thread marks the first; the Checkpointer's
writer-reader thread (or ``close()`` when it gives up on the writer) completes the second; the training thread only
reads the handle or waits. Every handle that is not skipped completes: committed, dropped (``skipped`` becomes True
with ``dropped``: another rank gave the step up, so no rank commits it), or failed with a
:class:`~ckptio.errors.CkptError`.
"""

from __future__ import annotations

import threading

from ckptio._wait import bounded


class SaveHandle:
    """One save: ``skipped`` now, ``done()``/``wait()`` for its commit."""

    def __init__(self, step: int, *, skipped: bool = False, skip_reason: str | None = None, slot_id: int | None = None,
                 save_id: int = 0) -> None:
        self.step = step
        self.skipped = skipped
        self.skip_reason = skip_reason
        self.blocking_s = 0.0
        self.bytes = 0
        self.slot_id = slot_id
        self.save_id = save_id
        self.returned_mono = 0.0
        self.requested_mono = 0.0
        self.interval_s: float | None = None
        self.dropped = False
        """Given up on every rank after this one staged it (``skipped`` is then True too)."""
        self.rolls_back = False
        """This save carries the rollback rule (the first save after a restore, until one commits)."""
        self._event = threading.Event()
        self._error: BaseException | None = None
        self._reported = False  # its error reached the caller (raised by a wait, or logged by a later save)
        self._staged = threading.Event()
        self._staging_error: BaseException | None = None
        self.copied = False
        """The staging copy ended (set under the tracker's lock): from then on the slot is no longer the staging
        thread's to give back. ``staged`` comes later, once the save is also with the writer."""
        if skipped:
            self._event.set()
            self._staged.set()

    def staged(self) -> bool:
        return self._staged.is_set()

    def wait_staged(self, timeout: float | None = None) -> None:
        """Block until the staging slot holds the snapshot (the state may be mutated after this); re-raise the
        staging error if the copy failed. ``TimeoutError`` if ``timeout`` passes first."""
        if not self._staged.wait(bounded(timeout)):
            raise TimeoutError(f"staging of step {self.step} not complete within {timeout} s")
        if self._staging_error is not None:
            self._reported = True
            raise self._staging_error

    def _mark_staged(self, error: BaseException | None = None) -> None:
        self._staging_error = error
        self._staged.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait until the save completed either way, without raising its error (which stays unreported)."""
        return self._event.wait(bounded(timeout))

    def wait(self, timeout: float | None = None) -> None:
        """Block until committed; re-raise the save's error. ``TimeoutError`` if ``timeout`` passes first."""
        if not self._event.wait(bounded(timeout)):
            raise TimeoutError(f"save of step {self.step} not committed within {timeout} s")
        if self._error is not None:
            self._reported = True
            raise self._error

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _finish(self, error: BaseException | None = None, *, dropped: str | None = None) -> bool:
        """Complete the handle once (``dropped``: the reason every rank gave it up); False when already complete."""
        if self._event.is_set():
            return False
        self._error = error
        if dropped is not None:
            self.skipped, self.dropped, self.skip_reason = True, True, dropped
        self._staged.set()  # a handle completed without staging (death, close) must not leave a waiter hanging
        self._event.set()
        return True

    def __repr__(self) -> str:
        state = ("dropped" if self.dropped else "skipped" if self.skipped else "failed" if self._error
                 else "committed" if self.done() else "pending")
        return f"SaveHandle(step={self.step}, {state})"
