"""Paced flushes: spread each save's durable write over the time it really has, so that the store, the data loader
reading from it and the other jobs on it never see a whole job's checkpoint arrive at full speed at once.

Two halves, one per process:

* :class:`PaceRule` (trainer) sets each save's rate from ``flush_pace``: None is full speed (the store's own);
  a number is the node's budget in bytes per second, shared evenly by the ranks of the node (each writer gets
  ``flush_pace / ranks_on_node``: ranks of one node save the same state shapes at the same steps, so equal shares
  spend the budget evenly); ``"auto"`` is this rank's bytes ÷ (``flush_pace_fraction`` × the time between saves),
  estimated as the shortest of the last three intervals and ``every_seconds`` (when set). The
  shortest, because the two ways to miss cost differently: a flush paced for too long an interval is still running
  when the next save needs its slot, and that save waits for the rest of it at full speed; one paced for too short
  an interval only finishes early. So long pauses (an evaluation, a restart of the data loader, the first saves of
  a run) never slow the next flushes, a shorter interval takes over at once, and a longer one once the three
  shorter have aged out. Without ``every_seconds``, one measured interval is not trusted (it may be such a pause:
  a run that evaluates after its first save): saves go at full speed until two are known.
* :class:`~ckptio.engine.writer.flush_pacer.FlushPacer` (writer) turns a rate into waits: each piece of a paced write
gets a ticket on a clock that
  starts with the flush (``start + bytes before it ÷ rate``) and goes out when its ticket is due. ``hurry()``
  releases the flush in progress at once: the writer calls it when the next save arrives, and the trainer asks for
  it when a save finds its slot busy, on an emergency save, and in ``close()`` — a pace never makes a save wait,
  skip or miss its grace period.

Pacing only stretches writes: it never changes what is written, what commits, or when a step counts as committed.
Neither half ever sleeps on the training thread.
"""

from __future__ import annotations

import collections
from typing import Literal

from ckptio.engine.side_group import SideGroup


def ranks_on_node(group: SideGroup, node: str) -> int:
    """How many ranks of the job share this rank's node (every rank calls it: one gather on the side group)."""
    nodes = group.broadcast_from_rank0(group.gather_to_rank0(node))
    return sum(1 for other in nodes if other == node) if nodes else 1


_RECENT = 3
"""Intervals the estimate is the shortest of."""
_TRUSTED = 2
"""Measured intervals needed before ``"auto"`` paces without ``every_seconds``."""


class PaceRule:
    """The trainer's half: the rate of each save's durable flush (None: full speed)."""

    def __init__(self, pace: float | Literal["auto"] | None, *, fraction: float, ranks_on_node: int,
                 every_seconds: float | None) -> None:
        self.pace, self.fraction, self.ranks_on_node = pace, fraction, max(1, ranks_on_node)
        self._recent: collections.deque[float] = collections.deque(maxlen=_RECENT)
        self._prior = every_seconds

    @property
    def interval_s(self) -> float | None:
        """The estimate of the time to the next save (None: not known well enough to pace by)."""
        if self._prior is not None:
            return min([self._prior, *self._recent])
        return min(self._recent) if len(self._recent) >= _TRUSTED else None

    def observe(self, interval_s: float | None) -> None:
        """The time since the previous save, measured at this one."""
        if interval_s is not None and interval_s > 0:
            self._recent.append(interval_s)

    def rate(self, nbytes: int) -> float | None:
        """Bytes per second for a flush of ``nbytes`` by this rank, or None for full speed."""
        if self.pace is None:
            return None
        if self.pace != "auto":
            return float(self.pace) / self.ranks_on_node
        interval = self.interval_s
        if interval is None or nbytes <= 0:
            return None
        return nbytes / (self.fraction * interval)
