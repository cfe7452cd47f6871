"""``SaveHandle``: what ``Checkpointer.save`` returns — skipped now, or committed/failed later.

The handle is completed by the Checkpointer's writer-reader thread (or by ``close()`` when it gives up on the
writer); the training thread only reads it or waits. Every handle that is not skipped completes: committed, or
failed with a :class:`~ckptio.errors.CkptError`.
"""

from __future__ import annotations

import threading


class SaveHandle:
    """One save: ``skipped`` now, ``done()``/``wait()`` for its commit."""

    def __init__(self, step: int, *, skipped: bool = False, skip_reason: str | None = None) -> None:
        self.step = step
        self.skipped = skipped
        self.skip_reason = skip_reason
        self.blocking_s = 0.0
        self.bytes = 0
        self.slot_id: int | None = None
        self.save_id = 0
        self.returned_mono = 0.0
        self.requested_mono = 0.0
        self.interval_s: float | None = None
        self.rolls_back = False
        """This save carries the rollback rule (the first save after a restore, until one commits)."""
        self._event = threading.Event()
        self._error: BaseException | None = None
        self._reported = False  # its error reached the caller (raised by a wait, or logged by a later save)
        if skipped:
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait until the save completed either way, without raising its error (which stays unreported)."""
        return self._event.wait(timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Block until committed; re-raise the save's error. ``TimeoutError`` if ``timeout`` passes first."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"save of step {self.step} not committed within {timeout} s")
        if self._error is not None:
            self._reported = True
            raise self._error

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _finish(self, error: BaseException | None = None) -> bool:
        """Complete the handle once; False when it was already complete."""
        if self._event.is_set():
            return False
        self._error = error
        self._event.set()
        return True

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else ("failed" if self._error else ("committed" if self.done() else
                                                                            "pending"))
        return f"SaveHandle(step={self.step}, {state})"
