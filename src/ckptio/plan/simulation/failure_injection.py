"""Failure injection: a job saving on a one- or two-level schedule, run through random failures event by event.

Owns the Monte-Carlo check of :mod:`ckptio.plan.costs.multilevel`: failures arrive as Poisson processes per class
(:class:`~ckptio.plan.costs.levels.FailureRates`), every save's stall, wait for the staging slot, and commit time per
level is placed on a timeline, and a failure rolls the job back to the newest save restorable after that kind of
failure, pays the restore of the level it comes from (failures during a restore start it over), and redoes the
work. Lost share = 1 − compute ÷ wall time. It must never model a store or a level's speed itself: every time
comes from :class:`~ckptio.plan.costs.levels.LevelTimes`, and whether a lost node's partners survive is drawn with the
model's own coverage probability (the one input the simulation takes from the model rather than checking it).

Between failures the timeline is periodic once a pattern has repeated with the same relative state (slot, saves
in flight, newest restorable per level), so the simulation jumps whole patterns there: its cost grows with the
failures injected, not with the saves between them, and :data:`MAX_FAILURES` bounds it.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptio.errors import ConfigError
from ckptio.plan.costs.levels import FailureRates, LevelTimes
from ckptio.plan.costs.multilevel import MODEL, LevelSchedule, TwoLevelPlan, expected_loss

_INF = math.inf
_CLASSES = ("soft", "node", "job")
_GIVE_UP = 50
"""Stop after this many times the requested failures: the job makes (next to) no progress."""
MAX_EVENTS = 2_000_000
"""Most saves and failures one schedule's simulation places on its timeline, whatever the schedule: the pattern
jump needs two durable saves between failures, so a schedule with thousands of saves per durable one (or per
failure) is placed save by save, and its time grows with them, not with the failures. Past this budget the
simulation stops with what the request would need."""
MAX_FAILURES = 100_000
"""Most failures one simulation injects. Its time grows in proportion (seconds for this many), and what it checks,
the model's lost share, is settled long before: the Monte-Carlo spread at this count, about 1/sqrt(failures), is
some 0.3 %, far below the first-order model's own error. A request for more is refused, not sampled."""


@dataclass(kw_only=True, slots=True)
class FailureSimResult:
    """What injecting failures into one schedule measured (``simulate --json``'s ``failures`` entries)."""

    schedule: LevelSchedule
    """The schedule simulated."""
    seed: int
    """Random seed (the same seed, inputs and schedule give the same result)."""
    failures: int = 0
    """Failures injected (restores interrupted by a failure included)."""
    failures_by_class: dict[str, int] = field(default_factory=dict)
    """Failures per class: soft, node, job."""
    restores_by_level: dict[str, int] = field(default_factory=dict)
    """Restores per level they read from: local, partner, durable."""
    compute_s: float = 0.0
    """Useful compute simulated."""
    wall_s: float = 0.0
    """Wall time it took."""
    lost_fraction: float = 0.0
    """1 − compute ÷ wall: stalls, rework and restores."""
    lost_work_s_mean: float = 0.0
    """Compute seconds redone per failure, averaged."""
    restore_s_mean: float = 0.0
    """Seconds per restore (an interrupted one counts what it ran), averaged."""
    converged: bool = True
    """False when the job stopped making progress and the run gave up."""

    def gpu_hours_per_day(self, ranks: int) -> float:
        return self.lost_fraction * ranks * 24.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _State:
    t: float = 0.0
    x: float = 0.0
    j: int = 0
    slot_free: float = 0.0
    loc: int = 0
    """Newest save committed at the local level (0: the job's start, restorable everywhere)."""
    dur: int = 0
    """Newest save committed at the durable level."""
    pending: list[tuple[int, float, float]] = field(default_factory=list)
    """Saves in flight: (index, local commit time, durable commit time)."""


def simulate_failures(times: LevelTimes, rates: FailureRates, replicas: int, schedule: LevelSchedule, *,
                      failures: int = 1000, seed: int = 0) -> FailureSimResult:
    """Run ``schedule`` for about ``failures`` failures' worth of compute (``failures × MTBF``)."""
    if not isinstance(failures, int) or not 1 <= failures <= MAX_FAILURES:
        raise ConfigError(f"failures to inject must be an integer from 1 to {MAX_FAILURES:,}, got {failures!r}")
    if schedule.two_level and times.local_flush_s is None:
        raise ConfigError("a two-level schedule needs the local level's times (give --local-bandwidth)")
    coverage = expected_loss(times, rates, replicas, schedule).partner_coverage
    return _Run(times, rates, schedule, coverage=coverage, seed=seed).run(failures / rates.total, failures)


def _promote(st: _State, now: float) -> None:
    """Count the levels committed by ``now``; forget saves with nothing left in flight."""
    left = []
    for j, t_local, t_durable in st.pending:
        if t_local <= now:
            st.loc = max(st.loc, j)
        if t_durable <= now:
            st.dur = max(st.dur, j)
        if any(now < t < _INF for t in (t_local, t_durable)):  # a level still in flight
            left.append((j, t_local, t_durable))
    st.pending = left


class _Run:
    def __init__(self, times: LevelTimes, rates: FailureRates, schedule: LevelSchedule, *, coverage: float,
                 seed: int) -> None:
        self.times, self.rates, self.coverage, self.rng = times, rates, coverage, random.Random(seed)
        self.tau, self.k, self.two = schedule.local_interval_s, schedule.durable_every, schedule.two_level
        self.f_l = times.local_flush_s if self.two and times.local_flush_s is not None else None
        self.result = FailureSimResult(schedule=schedule, seed=seed, failures_by_class=dict.fromkeys(_CLASSES, 0),
                                       restores_by_level=dict.fromkeys(("local", "partner", "durable"), 0))
        self.lost_work = self.restore_time = 0.0
        self.events = 0
        self.requested = self.give_up = 0

    def run(self, compute_s: float, failures: int) -> FailureSimResult:
        st, r = _State(), self.result
        self.requested, self.give_up = failures, _GIVE_UP * failures
        next_fail = self.rng.expovariate(self.rates.total)
        previous: tuple[float, tuple[Any, ...]] | None = None
        while st.x < compute_s:
            if r.failures > self.give_up:
                r.converged = False
                break
            self._count_event()
            target_x = min((st.j + 1) * self.tau, compute_s)
            if next_fail <= st.t + (target_x - st.x):
                st.x, st.t = st.x + (next_fail - st.t), next_fail  # the work done until the failure is lost
                next_fail = self._fail(st, next_fail)
                previous = None
                continue
            st.t, st.x = st.t + (target_x - st.x), target_x
            if st.x >= compute_s:
                break
            durable = self._save(st, next_fail)
            if durable is None:  # the failure hit during the save's stall
                next_fail = self._fail(st, next_fail)
                previous = None
            elif durable:
                previous = self._maybe_jump(st, previous, next_fail, compute_s)
        r.compute_s, r.wall_s = st.x, st.t
        r.lost_fraction = 1.0 - st.x / st.t if st.t > 0 else 0.0
        r.lost_work_s_mean = self.lost_work / max(1, r.failures)
        r.restore_s_mean = self.restore_time / max(1, r.failures)
        return r

    def _count_event(self) -> None:
        """One more save or failure on the timeline; past :data:`MAX_EVENTS` a ConfigError says what would fit."""
        self.events += 1
        if self.events <= MAX_EVENTS:
            return
        per_failure = self.events / max(1, self.result.failures)
        fits = int(MAX_EVENTS / per_failure) if self.result.failures else 0
        what = (f"inject at most {fits:,} failures" if fits >= 1 else
                "save less often, or durably more often, for a simulation event by event")
        raise ConfigError(f"the schedule (a save every {self.tau:g} s of compute, every {self.k}-th durable) needs "
                          f"more than {MAX_EVENTS:,} saves and failures to simulate {self.requested:,} failures "
                          f"(about {per_failure:,.0f} per failure so far): {what}")

    def _save(self, st: _State, next_fail: float) -> bool | None:
        """Request save j+1 at ``st.t``: True/False whether it is durable, None when a failure ends its stall."""
        b, f_d, f_l = self.times.blocking_s, self.times.durable_flush_s, self.f_l
        j = st.j + 1
        durable = not self.two or j % self.k == 0
        _promote(st, st.t)
        start = max(st.t, st.slot_free)
        held = max(f_l or 0.0, f_d if durable else 0.0)  # the slot is held until the save's last level commits
        resume = start + b + (held if self.times.synchronous else 0.0)
        if next_fail <= resume:
            return None
        st.pending.append((j, start + b + f_l if f_l is not None else _INF, start + b + f_d if durable else _INF))
        st.slot_free, st.t, st.j = start + b + held, resume, j
        return durable

    def _fail(self, st: _State, at: float) -> float:
        """Roll back after a failure at ``at`` (and any that interrupt the restore); the next failure's time."""
        _promote(st, at)
        st.pending.clear()  # saves in flight die with the job
        r, t = self.result, at
        while True:
            r.failures += 1
            self._count_event()
            target, restore, level = self._target(st)
            r.restores_by_level[level] += 1
            self.lost_work += max(0.0, st.x - target * self.tau)
            st.x = target * self.tau
            next_fail = t + self.rng.expovariate(self.rates.total)
            if next_fail >= t + restore:
                self.restore_time += restore
                break
            self.restore_time += next_fail - t
            t = next_fail
            if r.failures > self.give_up:  # restores never finish: the caller's loop gives up
                st.t, st.j, st.slot_free = t, target, t
                return next_fail
        st.t, st.j, st.slot_free = t + restore, target, t + restore
        return next_fail

    def _target(self, st: _State) -> tuple[int, float, str]:
        """(save restored, restore seconds, level) for a failure of a randomly drawn class."""
        rates, times = self.rates, self.times
        u = self.rng.random() * rates.total
        cls = "soft" if u < rates.soft else ("node" if u < rates.soft + rates.node else "job")
        self.result.failures_by_class[cls] += 1
        r_dur = times.restore_durable_s
        if self.two and cls != "job" and (cls == "soft" or self.rng.random() < self.coverage):
            level = "local" if cls == "soft" else "partner"
            level_s = times.restore_local_s if cls == "soft" else times.restore_partner_s
            level_s = r_dur if level_s is None else level_s
            target = max(st.loc, st.dur)
            if target > st.loc:  # the newest restorable save is only on the durable level so far
                return target, r_dur, "durable"
            if target == st.dur and r_dur < level_s:  # also durable: the faster intact copy
                return target, r_dur, "durable"
            return target, level_s, level
        st.loc = min(st.loc, st.dur)  # no local copy of anything newer survives
        return st.dur, r_dur, "durable"

    def _maybe_jump(self, st: _State, previous: tuple[float, tuple[Any, ...]] | None, next_fail: float,
                    compute_s: float) -> tuple[float, tuple[Any, ...]] | None:
        """At a durable save: when the state relative to it repeats the previous durable save's, jump whole
        patterns up to shortly before the next failure."""
        rel = (round(st.slot_free - st.t, 6), st.j - st.loc if self.two else 0, st.j - st.dur,
               tuple((st.j - j, round(a - st.t, 6), round(d - st.t, 6)) for j, a, d in st.pending
                     if a > st.t or d > st.t))
        if previous is not None and previous[1] == rel:
            period, per_pattern = st.t - previous[0], self.k * self.tau
            m = min(math.floor((next_fail - st.t) / period), math.floor((compute_s - st.x) / per_pattern)) - 1
            if m >= 1:
                shift_t, shift_j = m * period, m * self.k
                st.t, st.x, st.j, st.slot_free = st.t + shift_t, st.x + m * per_pattern, st.j + shift_j, \
                    st.slot_free + shift_t
                st.loc, st.dur = st.loc + shift_j, st.dur + shift_j
                st.pending = [(j + shift_j, a + shift_t, d + shift_t) for j, a, d in st.pending]
                return None
        return (st.t, rel)


def compare_with_plan(plan: TwoLevelPlan, *, failures: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Inject failures into ``plan``'s single-level and two-level schedules: what each measured, beside what the
    model predicted (``simulate --json``'s ``failures`` key)."""
    out: dict[str, Any] = {"model": MODEL, "seed": seed, "restore_s": plan.times.restore_json()}
    replicas = plan.replicas or 0
    for name, loss in (("single", plan.single), ("two_level", plan.two_level)):
        if loss is None:
            out[name], out[f"lost_gpu_hours_per_day_{name}"] = None, None
            continue
        sim = simulate_failures(plan.times, plan.rates, replicas, loss.schedule, failures=failures, seed=seed)
        out[f"lost_gpu_hours_per_day_{name}"] = sim.gpu_hours_per_day(plan.ranks)
        out[name] = {**sim.to_json(), "lost_gpu_hours_per_day": sim.gpu_hours_per_day(plan.ranks),
                     "plan_lost_fraction": loss.lost_fraction,
                     "plan_lost_gpu_hours_per_day": loss.gpu_hours_per_day(plan.ranks)}
    return out
