"""The probe's time bound, and the stop flag an interrupt raises for every worker.

Shared by the probe (:mod:`ckptio.plan.measure.probe`), which owns the phases, and its targets
(:mod:`ckptio.plan.measure.probe_targets`), which check the bound between chunks; neither imports the other's
module for it. It must never sleep or stop a worker itself: workers look at it and stop on their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Progress = Callable[[str, float], None]
"""Called with a phase description and the fraction of the time bound spent so far."""


class Clock:
    """The probe's time bound, and the stop flag an interrupt raises for every worker."""

    def __init__(self, max_seconds: float, progress: Progress | None) -> None:
        self.start = time.monotonic()
        self.max_seconds = max_seconds
        self.stop = threading.Event()
        self.truncated = False
        self._progress = progress

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def at(self, share: float) -> float:
        """The monotonic time at which ``share`` of the bound is spent."""
        return self.start + self.max_seconds * share

    def expired(self, deadline: float) -> bool:
        if self.stop.is_set():
            return True
        if time.monotonic() >= deadline:
            self.truncated = True
            return True
        return False

    def report(self, phase: str) -> None:
        if self._progress is not None:
            self._progress(phase, min(self.elapsed() / self.max_seconds, 1.0))
