"""Paced flushes as the planner sees them: the burst a job's saves put on the store, what the job asks of it when
its flushes are paced, and how late its saves become durable either way.

Owns the closed form of ``Checkpointer(flush_pace=...)`` (the engine's rule is :mod:`ckptio.engine.trainer.pace_rule`):

* **Peak demand** — every rank writing at full speed at once, as an unpaced flush starts: what the store sees is
  what it and the writers can take, the aggregate bandwidth, the sum of the writers' own caps, or the bytes a
  second its metadata or request rate lets through, whichever is least. A store shared with other jobs and with
  the data loader gives that burst to one job while it lasts.
* **Paced demand** — with ``"auto"`` each rank spreads its bytes over ``fraction`` × the interval, so the job moves
  its bytes in that window: job bytes ÷ (fraction × interval) (:func:`paced_demand`). With a number (the node's
  budget) each writer gets budget ÷ ranks on its node, so the job asks budget × nodes. Never more than the peak:
  a pace only slows a writer down.
* **Lag to durability** — unpaced, the flush time; paced, the window (the longest rank's bytes at its paced rate),
  or the unpaced flush when the store is slower than the pace. A window longer than the interval never lasts: the
  next save sends the flush to full speed (the engine's ``hurry``), so the lag is the interval plus the rest of
  the bytes at the unpaced flush's speed.
* **Work lost per failure, paced** — the budget's rule (half a cycle, plus the time until the newest save commits,
  at most a cycle) with the paced lag in place of the flush: until a paced save is durable, a failure restarts
  from the one before it.

Pacing never changes what commits: only how long the write takes. This module must never decide admission
(:mod:`ckptio.plan.admit` does) nor step through time (:mod:`ckptio.plan.simulation` models paced writers).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import BurstBudget
from ckptio.plan.costs.fairshare import max_min_rates
from ckptio.plan.costs.store import StoreLimits, checkpoint_traffic_cap
from ckptio.plan.job.checkpoint import CheckpointShape

DEFAULT_FRACTION = 0.5
"""``Checkpointer(flush_pace_fraction=)``'s default: a paced flush takes half the time between saves."""


def paced_demand(job_bytes: int, *, interval_s: float, fraction: float) -> float:
    """Bytes per second the whole job asks of the store under ``flush_pace="auto"``: each rank's flush is spread over
    ``fraction`` × ``interval_s``, so together the ranks move the job's ``job_bytes`` in that window."""
    if not (job_bytes >= 0 and interval_s > 0 and 0 < fraction <= 1):
        raise ConfigError(f"paced demand needs bytes >= 0, an interval > 0 and a fraction in (0, 1], got "
                          f"{job_bytes!r}, {interval_s!r}, {fraction!r}")
    return job_bytes / (fraction * interval_s)


@dataclass(kw_only=True, slots=True, frozen=True)
class FlushPace:
    """A job's ``flush_pace`` setting, as ``Checkpointer`` takes it."""

    pace: float | Literal["auto"] | None = None
    """None: every flush at full speed; ``"auto"``: each within :attr:`fraction` of the interval; a number: the
    node's budget in bytes per second, shared evenly by its ranks."""

    fraction: float = DEFAULT_FRACTION
    """With ``"auto"``: the share of the interval each flush may take."""

    ranks_per_node: int = 8
    """Ranks sharing a node's budget (a number pace only)."""

    def __post_init__(self) -> None:
        if self.pace is not None and self.pace != "auto" and not (
                isinstance(self.pace, (int, float)) and 0 < self.pace < math.inf):
            raise ConfigError(f'flush pace must be None, "auto" or bytes per second > 0, got {self.pace!r}')
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"flush pace fraction must be within (0, 1], got {self.fraction!r}")
        if not (isinstance(self.ranks_per_node, int) and self.ranks_per_node >= 1):
            raise ConfigError(f"ranks per node must be an int >= 1, got {self.ranks_per_node!r}")

    def rank_rate(self, rank_bytes: float, interval_s: float) -> float:
        """Bytes per second one rank's writer is held to (``inf``: full speed), as the engine's ``PaceRule``."""
        if self.pace is None or rank_bytes <= 0:
            return math.inf
        if self.pace == "auto":
            return rank_bytes / (self.fraction * interval_s)
        return float(self.pace) / self.ranks_per_node

    def label(self) -> str:
        """The setting as a ``Checkpointer`` argument reads: ``"auto"``, ``2.0e+09``, ``None``."""
        return '"auto"' if self.pace == "auto" else repr(self.pace)


@dataclass(kw_only=True, slots=True, frozen=True)
class PacePlan:
    """The burst and the paced demand of one job on one store (``plan --json`` prints these keys)."""

    flush_pace: float | str | None
    """The job's ``flush_pace`` (None: not paced; the paced figures are then those ``"auto"`` would give)."""
    flush_pace_fraction: float
    """``flush_pace_fraction`` of the paced figures."""
    peak_demand_bytes_per_s: float
    """Every rank writing at full speed at once: the burst the store sees, bounded by what it and the writers take."""
    paced_demand_bytes_per_s: float
    """The job's bytes a second with its flushes paced."""
    auto_demand_bytes_per_s: float
    """The job's bytes a second under ``"auto"`` at ``flush_pace_fraction`` (the paced demand, unless the pace is a
    number)."""
    unpaced_lag_s: float
    """Save return to durable, unpaced: the flush time."""
    paced_lag_s: float
    """Save return to durable, paced: the window, or the unpaced flush when longer; a window past the next save is
    cut short by it (the rest goes at full speed)."""
    paced_expected_lost_work_s: float
    """The budget's ``expected_lost_work_s`` with the saves durable ``paced_lag_s`` after they return."""
    store_share: float | None
    """The share of the store's write bandwidth the job may take (``--store-share``); None: not judged."""
    store_share_bytes_per_s: float | None
    """``store_share`` × the store's write bandwidth."""
    recommended_flush_pace: str | None
    """``"auto"`` when the job's demand as set exceeds the share and ``"auto"``'s does not; else None."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def paced(self) -> bool:
        return self.flush_pace is not None

    @property
    def demand_bytes_per_s(self) -> float:
        """What the job as set asks of the store: the peak unpaced, the paced demand paced."""
        return self.paced_demand_bytes_per_s if self.paced else self.peak_demand_bytes_per_s


def peak_demand(shape: CheckpointShape, storage: StoreLimits) -> float:
    """Bytes per second the store sees while every rank writes at full speed (the module docstring's rule)."""
    return _job_rate(shape, storage, [storage.per_writer_bytes_per_s] * len(shape.classes))


def _job_rate(shape: CheckpointShape, storage: StoreLimits, caps: list[float]) -> float:
    """The store's max-min share of every writing rank, each held to its class's cap, bounded by the request or
    metadata rate."""
    flows = [(c.count if c.bytes > 0 else 0, cap) for c, cap in zip(shape.classes, caps, strict=True)]
    rates = max_min_rates(storage.write_bytes_per_s, flows)
    total = sum(count * rate for (count, _), rate in zip(flows, rates, strict=True) if count)
    return min(total, checkpoint_traffic_cap(shape, storage))


def plan_pace(shape: CheckpointShape, storage: StoreLimits, budget: BurstBudget, pace: FlushPace, *,
              store_share: float | None = None) -> PacePlan:
    """The burst, the paced demand and the lags of ``shape``'s saves on ``storage`` at ``budget``'s interval and
    unpaced flush, judged against ``store_share`` of the store when given. A synchronous save (``budget.mode``) is
    never recommended a pace: training waits for its flush, which a pace would stretch."""
    if store_share is not None and not 0 < store_share <= 1:
        raise ConfigError(f"store share must be within (0, 1], got {store_share!r}")
    peak = peak_demand(shape, storage)
    auto_pace = FlushPace(pace="auto", fraction=pace.fraction, ranks_per_node=pace.ranks_per_node)
    paced, lag = _paced(shape, storage, budget, pace if pace.pace is not None else auto_pace, peak=peak)
    auto = paced if pace.pace in (None, "auto") else _paced(shape, storage, budget, auto_pace, peak=peak)[0]
    share_bps = store_share * storage.write_bytes_per_s if store_share is not None else None
    demand = peak if pace.pace is None else paced
    fits_only_paced = share_bps is not None and demand > share_bps >= auto
    return PacePlan(
        flush_pace=pace.pace, flush_pace_fraction=pace.fraction, peak_demand_bytes_per_s=peak,
        paced_demand_bytes_per_s=paced, auto_demand_bytes_per_s=auto, unpaced_lag_s=budget.flush_s,
        paced_lag_s=lag, paced_expected_lost_work_s=_lost_work(budget, lag), store_share=store_share,
        store_share_bytes_per_s=share_bps,
        recommended_flush_pace="auto" if fits_only_paced and budget.mode == "async" and pace.pace != "auto" else None,
    )


def _lost_work(budget: BurstBudget, lag_s: float) -> float:
    """The budget's work lost per failure with saves durable ``lag_s`` after they return instead of the flush."""
    cycle = budget.interval_s + budget.stall_s_per_checkpoint
    unpaced = min(budget.blocking_s + budget.flush_s, cycle)
    return budget.expected_lost_work_s - unpaced + min(budget.blocking_s + lag_s, cycle)


def _paced(shape: CheckpointShape, storage: StoreLimits, budget: BurstBudget, pace: FlushPace, *,
           peak: float) -> tuple[float, float]:
    """The job's demand under ``pace`` and its lag to durability."""
    interval_s, flush_s = budget.interval_s, budget.flush_s
    rates = [pace.rank_rate(c.bytes, interval_s) for c in shape.classes]
    caps = [min(storage.per_writer_bytes_per_s, rate) for rate in rates]
    demand = min(peak, _job_rate(shape, storage, caps))
    window = max((c.bytes / rate for c, rate in zip(shape.classes, rates, strict=True) if c.bytes > 0), default=0.0)
    if window > interval_s:  # the next save hurries it: the rest of the bytes at full speed
        window = interval_s + (1.0 - interval_s / window) * flush_s
    return demand, max(window, flush_s)
