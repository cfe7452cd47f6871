"""The writer's half of paced flushes: turn a save's rate into waits, and go full speed when asked.

The rate comes from the trainer's :class:`~ckptio.engine.trainer.pace_rule.PaceRule` (the module that states the
whole pacing rule). :class:`FlushPacer` gives each piece of a paced write a ticket on a clock that starts with the
flush (``start + bytes before it ÷ rate``) and sends it when its ticket is due. ``hurry()`` releases the flush in
progress at once: the writer calls it when the next save arrives, and the trainer asks for it when a save finds its
slot busy, on an emergency save, and in ``close()`` — a pace never makes a save wait, skip or miss its grace period.

Pacing only stretches writes: it never changes what is written, what commits, or when a step counts as committed.
This module is imported by the writer process and must stay torch-free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ckptio._wait import bounded


@dataclass(frozen=True, slots=True)
class PaceReport:
    """How one paced flush went."""

    target_bytes_per_s: float
    achieved_bytes_per_s: float
    bytes: int
    seconds: float
    stretched_s: float
    """Wall time during which the pace held the flush back (waits of several threads at once count once)."""
    hurried: bool
    """The flush went to full speed before its end (the next save, an emergency save, or close())."""


class PacedFlush:
    """One flush's ticket clock (:class:`~ckptio.storage.base.Pacer`); shared by the threads that write it."""

    def __init__(self, rate: float | None, *, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[threading.Event, float], object] = threading.Event.wait,
                 on_finish: Callable[[PacedFlush], None] = lambda flush: None) -> None:
        self.rate, self._clock, self._wait, self._on_finish = rate, clock, wait, on_finish
        self.hurry = threading.Event()
        """Set: full speed from now to the end of this flush."""
        self._lock = threading.Lock()
        self.start = clock()
        self.sent = 0
        self._waits: list[tuple[float, float]] = []
        self.report: PaceReport | None = None
        """Set when the flush ends as a ``with`` block (:meth:`finish`'s report)."""

    @property
    def pacer(self) -> PacedFlush | None:
        """What a write's ``pacer=`` gets: this flush when it is paced, else None (no wait to compute)."""
        return self if self.rate else None

    def take(self, nbytes: int) -> None:
        with self._lock:
            due = self.start + self.sent / self.rate if self.rate else 0.0
            self.sent += nbytes
        if self.hurry.is_set():
            return
        began = self._clock()
        if due > began:
            # A tiny rate puts the ticket centuries away: the wait is bounded (ckptio._wait), a hurry still ends it.
            self._wait(self.hurry, bounded(due - began) or 0.0)  # returns early once hurried
            with self._lock:
                self._waits.append((began, min(due, self._clock())))

    def finish(self) -> PaceReport | None:
        """The report of a paced flush (None for one at full speed from the start); it can be hurried no more."""
        self._on_finish(self)
        if not self.rate:
            return None
        seconds = max(self._clock() - self.start, 1e-9)
        return PaceReport(target_bytes_per_s=self.rate, achieved_bytes_per_s=self.sent / seconds, bytes=self.sent,
                          seconds=seconds, stretched_s=_union(self._waits), hurried=self.hurry.is_set())

    def __enter__(self) -> PacedFlush:
        return self

    def __exit__(self, *exc: object) -> None:
        self.report = self.finish()


def _union(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


class FlushPacer:
    """The writer's half: the flushes in progress, and the switch that sends them to full speed.

    Jobs are counted as they arrive and as they start. A save that arrives while a flush runs sends that flush to
    full speed (the next save must not wait behind it), and a flush starts at full speed while a later save is
    already queued. The trainer's ``hurry`` (a save found its slot busy, ``close()``) covers every save submitted
    until then, started or not: the message may overtake a job still being serialized."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[threading.Event, float], object] = threading.Event.wait) -> None:
        self._clock, self._wait = clock, wait
        self._lock = threading.Lock()
        self._active: set[PacedFlush] = set()
        self._arrived = self._started = self._hurried_through = 0

    def begin(self, rate: float | None) -> PacedFlush:
        """A flush of the running job at ``rate`` bytes per second (None: full speed). Use it as a ``with`` block
        (or call its ``finish()``) around its writes."""
        flush = PacedFlush(rate, clock=self._clock, wait=self._wait, on_finish=self._ended)
        with self._lock:
            if not rate or self._started <= self._hurried_through or self._arrived > self._started:
                flush.hurry.set()
            self._active.add(flush)
        return flush

    def _ended(self, flush: PacedFlush) -> None:
        with self._lock:
            self._active.discard(flush)

    def hurry(self) -> None:
        """Full speed for every save submitted so far: the flushes in progress and those not begun yet."""
        with self._lock:
            self._hurried_through = self._arrived
            for flush in self._active:
                flush.hurry.set()

    def job_arrived(self) -> None:
        """A save was queued: the flushes in progress must not make it wait."""
        with self._lock:
            self._arrived += 1
            for flush in self._active:
                flush.hurry.set()

    def job_started(self) -> None:
        with self._lock:
            self._started += 1
