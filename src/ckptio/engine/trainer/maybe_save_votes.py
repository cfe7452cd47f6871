"""Per-step decisions every rank must take at the same step, agreed without blocking the training thread.

``maybe_save`` has two decisions that one rank alone can see coming: a time-based save (``every_seconds``: rank 0's
clock decides, since the ranks' clocks differ) and the emergency save after a SIGTERM that reached some ranks only.
Agreeing on them with a blocking all-reduce at every call would put a collective on every training step, absorbing
the skew between ranks each time, which the steady path must never do.

So each ``maybe_save`` call starts an *asynchronous* all-reduce of this call's flags on the side group and reads the
result of the one started :data:`LAG` calls earlier, long complete in lockstep training. Every rank reads the same
result at the same call, so the decision lands on the same step everywhere, ``LAG`` steps after the flag was raised.
Calls must be made on every rank alike (SPMD), as for every collective; a single process decides at once.
"""

from __future__ import annotations

import collections
import datetime
import time
from typing import Any

from ckptio._wait import bounded
from ckptio.engine.side_group import SideGroup
from ckptio.errors import ConfigError

LAG = 2
"""Calls between raising a flag and acting on it: the result is read two steps later, by then long arrived."""


class StepVotes:
    """OR of each flag across ranks, ``LAG`` ``maybe_save`` calls late (at once without torch.distributed)."""

    def __init__(self, group: SideGroup, n_flags: int, *, timeout_s: float) -> None:
        self.group, self.n_flags, self.timeout_s = group, n_flags, timeout_s
        self._in_flight: collections.deque[tuple[Any, Any]] = collections.deque()

    def exchange(self, flags: list[bool]) -> list[bool]:
        """Start this call's vote; return the agreed flags of the vote ``LAG`` calls ago (all False at first)."""
        assert len(flags) == self.n_flags
        work, tensor = self.group.any_true_async(flags)
        if work is None:  # a single process: nothing to agree
            return [bool(x) for x in tensor.tolist()]
        self._in_flight.append((work, tensor))
        if len(self._in_flight) <= LAG:
            return [False] * self.n_flags
        work, tensor = self._in_flight.popleft()
        self._wait(work)
        return [int(x) > 0 for x in tensor.tolist()]

    def _wait(self, work: Any) -> None:
        began = time.monotonic()
        try:
            work.wait(datetime.timedelta(seconds=bounded(self.timeout_s) or 0.0))
        except RuntimeError as exc:
            raise ConfigError(f"the ranks' maybe_save votes did not meet within {time.monotonic() - began:.0f} s: "
                            f"every rank must call maybe_save at the same steps ({exc})",
                            rank=self.group.rank) from exc

    def drain(self, timeout_s: float = 5.0) -> None:
        """Let the votes in flight finish before the group goes away (bounded: a rank that stopped calling early
        must not hang close)."""
        while self._in_flight:
            work, _ = self._in_flight.popleft()
            try:
                work.wait(datetime.timedelta(seconds=timeout_s))
            except RuntimeError:
                return


class MaybeSaveVotes:
    """``maybe_save``'s two agreed decisions: a time-based save is due (rank 0's clock), and some rank was
    preempted. No vote at all when neither is watched (``every_steps`` alone decides from the step number)."""

    def __init__(self, group: SideGroup, *, every_seconds: float | None, watch_preemption: bool,
                 timeout_s: float) -> None:
        self.every_seconds, self.watch_preemption = every_seconds, watch_preemption
        self._votes = StepVotes(group, 2, timeout_s=timeout_s)
        self._rank0 = group.rank == 0
        self._time_raised = False  # rank 0 raised "time is due" and waits for the vote to come back
        self.used = False
        """Whether ``maybe_save`` ever voted: then a SIGTERM is acted on when the vote says so, on every rank at
        the same call, and not by a ``save`` call on one rank alone."""

    def decide(self, *, elapsed_s: float, preempted: bool) -> tuple[bool, bool]:
        """(a time-based save is due now, a rank was preempted), the same on every rank at this call."""
        if self.every_seconds is None and not self.watch_preemption:
            return False, False
        self.used = True
        raise_time = (self.every_seconds is not None and self._rank0 and not self._time_raised
                      and elapsed_s >= self.every_seconds)
        self._time_raised |= raise_time
        time_due, any_preempted = self._votes.exchange([raise_time, self.watch_preemption and preempted])
        if time_due:
            self._time_raised = False
        return time_due, any_preempted

    def drain(self) -> None:
        self._votes.drain()
