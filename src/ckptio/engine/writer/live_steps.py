"""Which steps a writer's saves may be writing right now, and the lock that keeps cleanup away from them.

A step is *live* from the moment the writer process receives its :class:`~ckptio.engine.protocol.SaveJob` (or a
:class:`~ckptio.engine.protocol.SaveReserve` ahead of the agreement) until the save's outcome is sent. Every
cleanup that deletes step directories or data files (retention, rollback retirement, local eviction) runs under
:meth:`LiveSteps.cleaning`, and registration waits for it: so a cleanup either sees a save as live, or the save's
first byte is written after the cleanup ended. This module only counts; it never deletes anything.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager


class LiveSteps:
    """A counted set of live steps (one step may be saved twice, or reserved and saved)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._steps: Counter[int] = Counter()

    def add(self, step: int) -> None:
        with self._lock:  # waits while a cleanup runs: the cleanup must not miss a save that starts meanwhile
            self._steps[step] += 1

    def remove(self, step: int) -> None:
        with self._lock:
            if self._steps[step] <= 1:
                self._steps.pop(step, None)
            else:
                self._steps[step] -= 1

    def steps(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._steps)

    @contextmanager
    def cleaning(self) -> Iterator[frozenset[int]]:
        """Hold off new registrations while a cleanup runs; yields the live steps it must leave alone."""
        with self._lock:
            yield frozenset(self._steps)
