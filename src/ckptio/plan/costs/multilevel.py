"""The two-level plan: how often to save to the node-local level (with partner copies) and how often durably.

Owns the multi-level model of ``ckptio plan``, its optimizer, and the answer it prints (:class:`TwoLevelPlan`). It must
never touch storage or draw failures (``plan.simulation.failure_injection`` checks this model by injecting them), and
never size a checkpoint (``plan.job.checkpoint``) or a burst (``plan.costs.budget``): it reads their answers.

The model is the first-order multi-level model of Di, Bouguerra, Bautista-Gomez and Cappello ("Optimization of
multi-level checkpoint model for large scale HPC applications", IPDPS 2014), the multi-level form of Young's:
the expected wall time ``T_w`` of ``T_e`` seconds of compute satisfies

    T_w = T_e·(1 + O) + Σ_c λ_c·T_w·(L_c + R_c),  so  lost share = 1 − T_e/T_w = 1 − (1 − Σ_c λ_c(L_c+R_c))/(1+O)

with ``O`` the checkpoint overhead per second of compute, and per failure class ``c`` (:mod:`ckptio.plan.costs.levels`)
its rate ``λ_c``, the expected work lost ``L_c`` (back to the newest save restorable after such a failure) and
the restore time ``R_c`` of the level it restores from. The pattern (SCR's, Moody et al., SC '10): a local-level
save every ``τ`` seconds of compute, every ``k``-th also durable. Assumptions, each arguable:

* Failures are exponential (Poisson per class), independent of the schedule; failures during a restore or a
  rework count as any other failure (the first-order form).
* A save blocks training for the copy (``--mode sync``: for its levels' writes), then each level's write runs
  in the background from the one staging slot, which the save holds until its last level commits; a save that
  finds the slot still held waits (so a durable flush longer than ``τ`` costs the next save a stall).
* A save is restorable at a level once that level commits; the newest restorable save wins whatever its level
  (a durable save committed before its local copy restores from durable). Saves in flight at a failure die.
* Losing a node needs a partner copy: covered unless every replica's node is lost too within the time the copy
  is needed (independent node failures). Losing the job needs the durable level.
* Ranks move in lockstep: the fullest node sets the local level's times, the burst of every rank the durable's.

The optimizer minimizes the lost share over ``τ`` and ``k`` (a grid, then a golden-section refinement), subject
to ``durable_share``: the share of the time the job's durable flushes may hold the shared store (the burst
ckptio exists to contain; 1 leaves it unconstrained). The single-level plan (every save durable, no local
level, what ckptio does without ``local_dir``) is the same model with ``k = 1`` and every class restoring from
the durable tier, optimized under the same constraint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import BurstBudget
from ckptio.plan.costs.inputs import DEFAULT_RANKS_PER_NODE, Network
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.levels import (
    FailureRates,
    LevelTimes,
    LocalLevel,
    emergency_grace_s,
    failure_rates,
    level_times,
)
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointShape

MODEL = "Di et al., IPDPS 2014 (first-order multi-level model; SCR's pattern, Moody et al., SC '10)"
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_GRID = 96
_K_DENSE = 48


@dataclass(kw_only=True, slots=True, frozen=True)
class LevelSchedule:
    """When saves happen: a save every ``local_interval_s`` of compute, every ``durable_every``-th durable."""

    local_interval_s: float
    """Compute seconds between saves (each a local-level save in a two-level schedule)."""
    durable_every: int = 1
    """Every k-th save also goes durable (1 in a single-level schedule: every save is durable)."""
    two_level: bool = True
    """False: no local level; every save is durable and every failure restores from the durable tier."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.local_interval_s) and self.local_interval_s > 0):
            raise ConfigError(f"the interval between saves must be > 0, got {self.local_interval_s!r}")
        if not isinstance(self.durable_every, int) or self.durable_every < 1:
            raise ConfigError(f"durable_every must be an integer >= 1, got {self.durable_every!r}")
        if not self.two_level and self.durable_every != 1:
            raise ConfigError("a single-level schedule saves durably every time (durable_every=1)")

    @property
    def durable_interval_s(self) -> float:
        return self.local_interval_s * self.durable_every


@dataclass(kw_only=True, slots=True)
class Loss:
    """The model's answer for one schedule."""

    schedule: LevelSchedule
    """The schedule evaluated."""
    lost_fraction: float
    """Share of wall time that is not useful compute: save stalls, rework and restores."""
    overhead_fraction: float
    """Save stalls per second of compute (``O``)."""
    stall_s_per_save: float
    """Training seconds lost per save, averaged over the pattern."""
    pattern_s: float
    """Wall seconds from one durable save to the next, without failures."""
    durable_store_share: float
    """Share of the time the durable store is busy with this job's flush."""
    partner_coverage: float
    """Probability a lost node's shards are on a partner (0 in a single-level schedule)."""
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per failure class: ``rate_per_day``, ``lost_work_s``, ``restore_s``, ``level`` it restores from."""

    def gpu_hours_per_day(self, ranks: int) -> float:
        return self.lost_fraction * ranks * 24.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class _Pattern:
    """One pattern of k saves in closed form (saves 2..k-1 are alike, so a pattern costs O(1) for any k)."""

    stall_s: float
    """Stalls of the k saves together."""
    wall_s: float
    """Wall seconds of the pattern (k·τ + stalls)."""
    local_lost_s: float
    """Expected work lost to a failure restorable from the newest save at any level."""
    local_delay_s: float
    """Mean request → restorable (first level to commit), over the k saves."""
    durable_delay_s: float
    """The durable save's request → durable commit."""
    durable_newest_s: float
    """Wall seconds per pattern during which the durable save is the newest restorable one."""


def _pattern(times: LevelTimes, tau: float, k: int, two_level: bool) -> _Pattern:
    b, f_d = times.blocking_s, times.durable_flush_s
    f_l = times.local_flush_s if two_level and times.local_flush_s is not None else f_d
    held = max(f_l, f_d)  # a durable save holds its slot until both levels commit

    def save(durable: bool, after_durable: bool) -> tuple[float, float, float]:
        """(stall, request → restorable at its first level, request → durable commit)."""
        if times.synchronous:
            wait, stall = 0.0, b + (held if durable else f_l)
        else:
            wait = max(0.0, (held if after_durable else f_l) - tau)
            stall = wait + b
        return stall, wait + b + (min(f_l, f_d) if durable else f_l), wait + b + f_d

    # Groups in pattern order as (count, stall, delay): the first save follows the previous pattern's durable
    # save, the last is the durable one.
    if k == 1:
        one = save(True, True)
        groups = [(1, one[0], one[1])]
        durable_delay = one[2]
    else:
        first, middle, last = save(False, True), save(False, False), save(True, False)
        groups = [(1, first[0], first[1]), (k - 2, middle[0], middle[1]), (1, last[0], last[1])]
        groups = [g for g in groups if g[0] > 0]
        durable_delay = last[2]
    wall = sum(n * (tau + s) for n, s, _ in groups)
    # Failure time uniform over the pattern: in cycle j the newest restorable save is j once its delay e_j has
    # passed, else j-1, one cycle earlier: ∫ over cycle j = c_j²/2 + e_j·c_{j-1}.
    integral, prev = 0.0, tau + groups[-1][1]
    for n, s, e in groups:
        c = tau + s
        integral += n * c * c / 2.0 + e * (prev + (n - 1) * c)
        prev = c
    # The durable save is the newest restorable from its first commit until the next pattern's first save's.
    newest = tau + groups[-1][1] + groups[0][2] - groups[-1][2]
    return _Pattern(stall_s=sum(n * s for n, s, _ in groups), wall_s=wall, local_lost_s=integral / wall,
                    local_delay_s=sum(n * e for n, _, e in groups) / k, durable_delay_s=durable_delay,
                    durable_newest_s=min(wall, max(0.0, newest)))


def expected_loss(times: LevelTimes, rates: FailureRates, replicas: int, schedule: LevelSchedule) -> Loss:
    """The lost share of ``schedule`` under the model (module docstring)."""
    tau, k, two = schedule.local_interval_s, schedule.durable_every, schedule.two_level
    if two and (times.local_flush_s is None or times.restore_local_s is None):
        raise ConfigError("a two-level schedule needs the local level's times (give --local-bandwidth)")
    p = _pattern(times, tau, k, two)
    durable_lost = p.wall_s / 2.0 + p.durable_delay_s
    r_dur = times.restore_durable_s
    classes: dict[str, dict[str, Any]] = {}
    coverage = 0.0
    if two:
        assert times.local_flush_s is not None and times.restore_local_s is not None
        # The newest restorable save is the durable one for part of the pattern: restored from the faster
        # intact copy, or from durable alone while its local level has not committed yet.
        both = p.durable_newest_s / p.wall_s
        only = min(both, max(0.0, times.local_flush_s - times.durable_flush_s) / p.wall_s)

        def restore(level_s: float) -> float:
            return (1 - both) * level_s + (both - only) * min(level_s, r_dur) + only * r_dur

        r_partner = times.restore_partner_s if times.restore_partner_s is not None else r_dur
        coverage = rates.partner_coverage(replicas, r_partner + p.wall_s / k + p.local_delay_s)
        classes["soft"] = _cls(rates.soft, p.local_lost_s, restore(times.restore_local_s), "local")
        classes["node"] = _cls(rates.node * coverage, p.local_lost_s, restore(r_partner), "partner")
        classes["node_uncovered"] = _cls(rates.node * (1 - coverage), durable_lost, r_dur, "durable")
        classes["job"] = _cls(rates.job, durable_lost, r_dur, "durable")
    else:
        for name, rate in (("soft", rates.soft), ("node", rates.node), ("job", rates.job)):
            classes[name] = _cls(rate, durable_lost, r_dur, "durable")
    failing = sum(c["rate_per_s"] * (c["lost_work_s"] + c["restore_s"]) for c in classes.values())
    overhead = p.stall_s / (k * tau)
    lost = 1.0 if failing >= 1.0 else 1.0 - (1.0 - failing) / (1.0 + overhead)
    return Loss(schedule=schedule, lost_fraction=lost, overhead_fraction=overhead, stall_s_per_save=p.stall_s / k,
                pattern_s=p.wall_s, durable_store_share=min(1.0, times.durable_flush_s / p.wall_s),
                partner_coverage=coverage, classes=classes)


def _cls(rate: float, lost_s: float, restore: float, level: str) -> dict[str, Any]:
    return {"rate_per_s": rate, "rate_per_day": rate * 86400.0, "lost_work_s": lost_s, "restore_s": restore,
            "level": level}


def optimize(times: LevelTimes, rates: FailureRates, replicas: int, *, two_level: bool, durable_share: float = 1.0,
             local_interval_s: float | None = None, durable_every: int | None = None,
             step_time_s: float | None = None) -> Loss:
    """The schedule with the least lost share whose durable flushes hold the store at most ``durable_share`` of
    the time; a given ``local_interval_s`` or ``durable_every`` is kept as given."""
    if not 0 < durable_share <= 1:
        raise ConfigError(f"durable share must be within (0, 1], got {durable_share!r}")
    fixed_k = 1 if not two_level else durable_every
    lo = max(1.0, step_time_s or 0.0)
    hi = max(4.0 / rates.total, 4.0 * times.durable_flush_s / durable_share, 10.0 * lo)
    taus = [local_interval_s] if local_interval_s else [lo * (hi / lo) ** (i / (_GRID - 1)) for i in range(_GRID)]
    ks = [fixed_k] if fixed_k else _k_candidates(hi / taus[0] if local_interval_s else hi / lo)

    def score(tau: float, k: int) -> float:
        loss = expected_loss(times, rates, replicas, LevelSchedule(local_interval_s=tau, durable_every=k,
                                                                   two_level=two_level))
        over = loss.durable_store_share - durable_share
        return loss.lost_fraction + (1.0 + over if over > 1e-12 else 0.0)  # infeasible ranks after feasible

    # k = 1 always stays a candidate: a given interval longer than the horizon leaves no other.
    best = min((score(t, k), t, k) for k in ks for t in taus if t * k <= hi * 1.0001 or fixed_k or k == 1)
    _, tau, k = best
    if not local_interval_s:
        step = (hi / lo) ** (1.0 / (_GRID - 1))
        tau = _golden(lambda t: score(t, k), max(lo, tau / step), min(hi, tau * step))
        if step_time_s:  # whole steps: the better of the two neighbours
            tau = min((max(1, math.floor(tau / step_time_s)) * step_time_s, math.ceil(tau / step_time_s)
                       * step_time_s), key=lambda t: score(t, k))
    return expected_loss(times, rates, replicas, LevelSchedule(local_interval_s=tau, durable_every=k,
                                                               two_level=two_level))


def _k_candidates(k_max: float) -> list[int]:
    ks = list(range(1, _K_DENSE + 1))
    while ks[-1] * 1.15 <= k_max:
        ks.append(math.ceil(ks[-1] * 1.15))
    return ks


def _golden(f: Any, a: float, b: float, iterations: int = 48) -> float:
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    return c if fc <= fd else d


@dataclass(kw_only=True, slots=True)
class TwoLevelPlan:
    """``plan``'s two-level answer (``plan --json`` merges :meth:`to_json` into the budget's keys)."""

    ranks: int
    """Ranks (GPUs) whose hours are lost."""
    nodes: int
    """Nodes the ranks occupy."""
    replicas: int | None
    """Partner copies per node; None without a local level."""
    rates: FailureRates
    """Failures per class."""
    times: LevelTimes
    """Commit and restore times per level."""
    single: Loss
    """Every save durable, every restore from the durable tier."""
    two_level: Loss | None
    """Local level plus partners, every k-th durable; None without ``--local-bandwidth``."""
    emergency_grace_s: float | None = None
    """The grace period the emergency save needs after a SIGTERM (``levels.emergency_grace_s``); None without a
    local level."""

    def to_json(self) -> dict[str, Any]:
        two = self.two_level
        return {
            "lost_gpu_hours_per_day_single": self.single.gpu_hours_per_day(self.ranks),
            "lost_gpu_hours_per_day_two_level": two.gpu_hours_per_day(self.ranks) if two else None,
            "local_interval_s": two.schedule.local_interval_s if two else None,
            "durable_interval_s": two.schedule.durable_interval_s if two else None,
            "durable_every": two.schedule.durable_every if two else None,
            "single_level_interval_s": self.single.schedule.local_interval_s,
            "restore_s": self.times.restore_json(),
            "emergency_grace_s": self.emergency_grace_s,
            "levels": {
                "model": MODEL, "nodes": self.nodes, "replicas": self.replicas,
                "failures": self.rates.to_json(), "times": self.times.to_json(),
                "single": self.single.to_json(), "two_level": two.to_json() if two else None,
            },
        }


def plan_two_levels(shape: CheckpointShape, storage: StoreLimits, schedule: Schedule, budget: BurstBudget, *,
                    local: LocalLevel | None, ranks_per_node: int | None = None, node_mtbf_s: float | None = None,
                    job_loss_mtbf_s: float | None = None, durable_share: float = 1.0,
                    local_interval_s: float | None = None, durable_every: int | None = None,
                    network: Network | None = None) -> TwoLevelPlan:
    """Single-level against two-level for ``shape`` on ``storage`` (``budget`` is ``plan_burst``'s answer for the
    same inputs); a given ``schedule.interval_s`` fixes the single-level interval. ``network`` carries the restores'
    exchange between ranks (default: the local level's, else :class:`Network` with ``ranks_per_node``)."""
    per_node = local.ranks_per_node if local else (ranks_per_node or DEFAULT_RANKS_PER_NODE)
    nodes = max(1, math.ceil(shape.ranks / per_node))
    rates = failure_rates(mtbf_s=budget.mtbf_s, nodes=nodes, node_mtbf_s=node_mtbf_s,
                          job_loss_mtbf_s=job_loss_mtbf_s, mtbf_given=schedule.mtbf_s is not None)
    times = level_times(shape, storage, budget, local,
                        network or (local.network if local else Network(ranks_per_node=per_node)))
    replicas = local.replicas if local else 0
    single = optimize(times, rates, replicas, two_level=False, durable_share=durable_share,
                      local_interval_s=schedule.interval_s, step_time_s=schedule.step_time_s)
    two = None
    if local is not None:
        two = optimize(times, rates, replicas, two_level=True, durable_share=durable_share,
                       local_interval_s=local_interval_s, durable_every=durable_every,
                       step_time_s=schedule.step_time_s)
    return TwoLevelPlan(ranks=shape.ranks, nodes=nodes, replicas=local.replicas if local else None, rates=rates,
                        times=times, single=single, two_level=two,
                        emergency_grace_s=emergency_grace_s(times, schedule.step_time_s))
