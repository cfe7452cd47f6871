"""Step timing: the training loop's own steps written into the event log, so the report can attribute every
step.

A step that overlapped ``save()`` staging was blocked by the checkpoint; one that overlapped a background
flush may have been slowed by contention; the rest are compute and communication. Only
``step_begin``/``step_end`` events are written here; the attribution is the report's job (``obs.report``).
This module must stay cheap enough to wrap every step: one monotonic read and one event per boundary, no I/O
beyond the event log's single append.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ckptio.errors import ConfigError
from ckptio.obs.events import Event, EventLog

__all__ = ["StepTimer"]


class StepTimer:
    """Writes ``step_begin``/``step_end`` events for training steps.

    Use ``with timer.step(n): ...`` around a step, or ``begin(n)``/``end(n)`` when a step's boundaries are in
    different places (a callback framework). Steps may not nest: ``begin`` while a step is open is an error,
    because the report attributes each moment to exactly one step.
    """

    def __init__(self, events: EventLog) -> None:
        if not isinstance(events, EventLog):
            raise ConfigError(f"StepTimer needs an ckptio.obs.events.EventLog, got {type(events)!r}")
        self.events = events
        self._open: tuple[int, float] | None = None
        self._lock = threading.Lock()
        self.last_seconds: float | None = None
        """Duration of the most recently ended step."""

    def begin(self, step: int) -> None:
        """Mark the start of training step ``step``."""
        step = _check_step(step)
        with self._lock:
            if self._open is not None:
                raise ConfigError(
                    f"step {step} begun while step {self._open[0]} is still open (call end first)"
                )
            self._open = (step, time.monotonic())
        self.events.emit(Event.STEP_BEGIN, step)

    def end(self, step: int) -> float:
        """Mark the end of training step ``step``; returns its duration in seconds."""
        step = _check_step(step)
        now = time.monotonic()
        with self._lock:
            if self._open is None or self._open[0] != step:
                open_step = None if self._open is None else self._open[0]
                raise ConfigError(f"step_end({step}) without a matching step_begin (open step: {open_step})")
            seconds = now - self._open[1]
            self._open = None
        self.last_seconds = seconds
        self.events.emit(Event.STEP_END, step, seconds=seconds)
        return seconds

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Time the body as training step ``step``; the step is ended even when the body raises."""
        self.begin(step)
        try:
            yield
        finally:
            self.end(step)


def _check_step(step: int) -> int:
    try:
        value = operator.index(step)  # accepts numpy and torch integer scalars, refuses floats
    except TypeError:
        value = -1
    if isinstance(step, bool) or value < 0:
        raise ConfigError(f"step must be a non-negative int, got {step!r}")
    return value
