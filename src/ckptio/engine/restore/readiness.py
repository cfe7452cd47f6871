"""The restore's readiness gate: before DCP plans, every rank says whether it could start, in one bounded meeting.

Each rank checks the chosen step's records (the manifest, ``.metadata``) before DCP plans, and can fail there alone:
rank 0 reads them once for the job and broadcasts their bytes, but a rank reads its own when rank 0 could not (and
then may see an older root, or a step its store lost), and every rank checks them itself (a ``.metadata`` that is
corrupt or names untrusted code; its reader needs a local directory it lacks). A rank that raised and left would leave
the others in DCP's plan gather until the side group's timeout (30 minutes). So every rank catches what stopped it and
comes here: one barrier bounded by ``ReadOptions.ready_timeout_s`` (a rank that never comes, dead or stuck in its store,
is named once it has passed), then every rank's outcome on every rank. If any rank failed, every rank raises: the
failing rank its own error, the others an error of the same class naming that rank and its reason
(:class:`~ckptio.errors.PeerLostError` when the rank failed with something other than a ckptio error, or never came). So
a failure before the exchange reaches every rank as soon as the last rank arrives, and within ``ready_timeout_s`` when
one never does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ckptio.engine.side_group import SideGroup
from ckptio.errors import CkptError, PeerLostError

T = TypeVar("T")
_MISSING = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


@dataclass(frozen=True, slots=True)
class RankFailure:
    """Why one rank could not start, in a form every rank can rebuild (a ckptio error pickles with its context;
    any other exception travels as its text)."""

    rank: int
    kind: type[CkptError] | None
    """The ckptio error class the rank raised, or None for any other exception."""
    message: str
    context: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> RankFailure:
        if isinstance(exc, CkptError):
            return cls(rank, type(exc), exc.message, exc.context)
        return cls(rank, None, f"{type(exc).__name__}: {exc}")

    def as_error(self, others: int = 0) -> CkptError:
        """The error a rank other than the failing one raises: the same class, naming the rank and its reason."""
        more = f" (and {others} other rank{'s' if others > 1 else ''})" if others else ""
        message = f"rank {self.rank}{more} could not start the restore: {self.message}"
        if self.kind is None:
            return PeerLostError(message, rank=self.rank, phase="ready")
        return self.kind(message, **{**self.context, "rank": self.rank})


def gather_ready(group: SideGroup, error: BaseException | None, *, timeout_s: float,
                 step: int | None) -> list[RankFailure]:
    """Every rank's failure (``error`` is this rank's, or None), on every rank, in rank order; every rank calls.
    :class:`PeerLostError` when some rank does not arrive within ``timeout_s``."""
    try:
        group.barrier_within(timeout_s)
    except RuntimeError as exc:
        found = _MISSING.search(str(exc))
        ranks = [int(r) for r in found.group(1).replace(" ", "").split(",") if r] if found else []
        who = (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}") if ranks else "a rank (rank 0 names it)"
        raise PeerLostError(f"{who} did not reach the restore's readiness gate within {timeout_s:.0f} s: it died, "
                            f"raised outside the restore, or is stuck in its store ({exc})",
                            rank=ranks[0] if len(ranks) == 1 else None, phase="ready", step=step) from exc
    mine = None if error is None else RankFailure.of(group.rank, error)
    outcomes = group.broadcast_from_rank0(group.gather_to_rank0(mine))
    return [f for f in outcomes if f is not None]


def check_ready(group: SideGroup, error: BaseException | None, *, timeout_s: float, step: int | None) -> None:
    """:func:`gather_ready`, then raise on every rank if any rank failed: this rank's own ``error`` as it is, the
    first failing rank's as :meth:`RankFailure.as_error` elsewhere."""
    failures = gather_ready(group, error, timeout_s=timeout_s, step=step)
    if error is not None:
        raise error
    if failures:
        raise failures[0].as_error(len(failures) - 1)


def rank0_choice(group: SideGroup, choose: Callable[[], T]) -> T:
    """``choose()`` run on rank 0 and its result broadcast to every rank. The others only wait in the broadcast, so
    whatever stops rank 0 is broadcast too and raised on every rank (rank 0's own exception, named elsewhere)."""
    own: BaseException | None = None
    choice: Any = None
    if group.rank == 0:
        try:
            choice = choose()
        except Exception as exc:  # the ranks waiting in the broadcast must learn it
            own, choice = exc, RankFailure.of(0, exc)
    chosen: T = group.broadcast_from_rank0(choice)
    if own is not None:
        raise own
    if isinstance(chosen, RankFailure):
        raise chosen.as_error()
    return chosen
