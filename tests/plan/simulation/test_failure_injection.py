"""Failures injected event by event against the two-level model: they agree within 10% on the same inputs.

Every case runs the plan's own optimal schedules (and one given schedule) through
:func:`ckptio.plan.simulation.failure_injection.simulate_failures` with a fixed seed and 1,500 failures: enough that the
Monte-Carlo spread (about 2%) leaves room for the first-order model's own error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckptio._cli.main import main
from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.levels import LocalLevel
from ckptio.plan.costs.multilevel import LevelSchedule, TwoLevelPlan, plan_two_levels
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import Parallelism, shape_checkpoint, uniform_shape
from ckptio.plan.job.presets import PRESETS
from ckptio.plan.simulation import failure_injection as failsim
from ckptio.plan.simulation.failure_injection import simulate_failures

GIB = float(1 << 30)
FAILURES = 1500


def _figure_plan(*, mode: str = "async", replicas: int = 1, share: float = 1.0, **kw: Any) -> TwoLevelPlan:
    model = PRESETS["mlperf-llama3-405b"].spec(parallelism=Parallelism.for_ranks(ranks=512, tp=8, pp=32, zero=1))
    shape = shape_checkpoint(model)
    storage = StoreLimits(write_bytes_per_s=150 * GIB, read_bytes_per_s=150 * GIB)
    schedule = Schedule(mtbf_s=3 * 3600.0, mode=mode)  # type: ignore[arg-type]
    budget = plan_burst(shape, storage, schedule)
    return plan_two_levels(shape, storage, schedule, budget, local=LocalLevel(bytes_per_s=5e9, replicas=replicas),
                           durable_share=share, **kw)


def _small_plan(**kw: Any) -> TwoLevelPlan:
    # 32 ranks on a slow store with frequent failures.
    shape = uniform_shape(ranks=32, bytes_per_rank=4 * GIB)
    storage = StoreLimits(write_bytes_per_s=2 * GIB, read_bytes_per_s=4 * GIB)
    schedule = Schedule(mtbf_s=2 * 3600.0)
    budget = plan_burst(shape, storage, schedule)
    return plan_two_levels(shape, storage, schedule, budget, local=LocalLevel(bytes_per_s=3e9, replicas=1),
                           node_mtbf_s=4 * 8 * 3600.0, job_loss_mtbf_s=24 * 3600.0, **kw)


CASES = {
    "figure": _figure_plan,
    "figure, store share 5%": lambda: _figure_plan(share=0.05),
    "figure, no replica, share 5%": lambda: _figure_plan(replicas=0, share=0.05),
    "figure, sync saves": lambda: _figure_plan(mode="sync", share=0.05),
    "figure, given schedule": lambda: _figure_plan(local_interval_s=60.0, durable_every=20),
    "small job, slow store": _small_plan,
    # The durable flush (64 s) outlasts the interval: every durable save makes the next one wait for the slot.
    "small job, flush outlasts the interval": lambda: _small_plan(local_interval_s=30.0, durable_every=4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_injected_failures_lose_what_the_plan_predicts_within_10_percent(case: str) -> None:
    plan = CASES[case]()
    assert plan.two_level is not None
    for loss in (plan.single, plan.two_level):
        sim = simulate_failures(plan.times, plan.rates, plan.replicas or 0, loss.schedule, failures=FAILURES,
                                seed=7)
        assert sim.converged and sim.failures > 0.8 * FAILURES
        assert sim.lost_fraction == pytest.approx(loss.lost_fraction, rel=0.10), (case, loss.schedule)


def test_restores_come_from_the_level_each_failure_leaves() -> None:
    plan = _figure_plan(share=0.05)
    assert plan.two_level is not None
    single = simulate_failures(plan.times, plan.rates, 1, plan.single.schedule, failures=400, seed=1)
    assert set(k for k, v in single.restores_by_level.items() if v) == {"durable"}
    two = simulate_failures(plan.times, plan.rates, 1, plan.two_level.schedule, failures=400, seed=1)
    by_class, by_level = two.failures_by_class, two.restores_by_level
    assert by_level["partner"] > by_level["local"] > 0  # node losses outnumber soft failures (78% vs 17%)
    assert by_level["durable"] >= by_class["job"]  # every job loss, plus the newest save still flushing locally
    assert two.lost_work_s_mean < single.lost_work_s_mean / 2


def test_the_same_seed_gives_the_same_run_and_jumping_whole_patterns_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = _small_plan()
    assert plan.two_level is not None
    schedule = LevelSchedule(local_interval_s=90.0, durable_every=5)
    first = simulate_failures(plan.times, plan.rates, 1, schedule, failures=300, seed=3)
    again = simulate_failures(plan.times, plan.rates, 1, schedule, failures=300, seed=3)
    assert first == again
    # The jump is an optimization only: stepping every save gives the same timeline.
    monkeypatch.setattr(failsim._Run, "_maybe_jump", lambda *args: None)
    stepped = simulate_failures(plan.times, plan.rates, 1, schedule, failures=300, seed=3)
    assert stepped.failures == first.failures and stepped.restores_by_level == first.restores_by_level
    assert stepped.wall_s == pytest.approx(first.wall_s, rel=1e-9)


def test_simulate_reports_lost_work_and_restores_for_both_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--preset", "mlperf-llama3-405b", "--ranks", "512", "--mtbf", "3h", "--write-bandwidth",
            "150GiB/s", "--read-bandwidth", "150GiB/s", "--local-bandwidth", "5GB/s", "--durable-share", "0.05",
            "--checkpoints", "3", "--failures", "300"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["failures"]
    assert out["lost_gpu_hours_per_day_two_level"] < out["lost_gpu_hours_per_day_single"]
    assert set(out["restore_s"]) == {"local", "partner", "durable"}
    for name in ("single", "two_level"):
        assert out[name]["lost_work_s_mean"] > 0 and out[name]["restore_s_mean"] > 0
        assert out[name]["plan_lost_gpu_hours_per_day"] > 0
    assert main(argv) == 0
    assert "failures injected" in capsys.readouterr().out


def test_more_failures_than_the_cap_are_refused_not_sampled() -> None:
    plan = _small_plan()
    with pytest.raises(ConfigError, match="100,000"):
        simulate_failures(plan.times, plan.rates, 1, plan.single.schedule, failures=failsim.MAX_FAILURES + 1)


def test_a_schedule_past_the_event_budget_stops_and_says_how_many_failures_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Many local saves per durable one: each failure costs a pattern's worth of saves, which the pattern jump cannot
    skip. Past the budget (made small here) the run stops with a ConfigError that says how many would fit."""
    plan = _small_plan()
    monkeypatch.setattr(failsim, "MAX_EVENTS", 20_000)
    dense = LevelSchedule(local_interval_s=1.0, durable_every=5000)
    with pytest.raises(ConfigError, match=r"inject at most [0-9,]+ failures"):
        simulate_failures(plan.times, plan.rates, 1, dense, failures=1000)


def test_restores_that_never_finish_end_the_run_as_not_converged() -> None:
    """Every restore outlasts the time to the next failure: the run gives up at 50 times the requested failures
    instead of looping for ever inside one restore."""
    shape = uniform_shape(ranks=32, bytes_per_rank=4 * GIB)
    storage = StoreLimits(write_bytes_per_s=2 * GIB, read_bytes_per_s=1e3)  # a durable restore of weeks
    schedule = Schedule(mtbf_s=60.0)
    budget = plan_burst(shape, storage, schedule)
    plan = plan_two_levels(shape, storage, schedule, budget, local=None)
    result = simulate_failures(plan.times, plan.rates, 0, plan.single.schedule, failures=20)
    assert not result.converged and result.failures == 20 * 50 + 1
