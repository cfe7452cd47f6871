"""``SaveHandle``: what ``Checkpointer.save`` returns — skipped now, or committed/failed later.

The handle is completed by the Checkpointer's writer-reader thread; the training thread only reads it or waits.
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
        self._event = threading.Event()
        self._error: BaseException | None = None
        if skipped:
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until committed; re-raise the save's error. ``TimeoutError`` if ``timeout`` passes first."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"save of step {self.step} not committed within {timeout} s")
        if self._error is not None:
            raise self._error

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._event.set()

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else ("failed" if self._error else ("committed" if self.done() else
                                                                            "pending"))
        return f"SaveHandle(step={self.step}, {state})"
