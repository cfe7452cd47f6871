"""The pace model: the burst every rank makes at full speed, what the job asks paced, and the lag to durability."""

from __future__ import annotations

import inspect
from typing import Literal

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import BurstBudget, plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.pace import FlushPace, PacePlan, paced_demand, peak_demand, plan_pace
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import uniform_shape

GB = 1e9


def _plan(storage: StoreLimits, pace: FlushPace, *, interval_s: float = 100.0, share: float | None = None,
          mode: Literal["async", "sync"] = "async") -> tuple[BurstBudget, PacePlan]:
    """Eight ranks of 1 GB each, saving every ``interval_s``."""
    shape = uniform_shape(ranks=8, bytes_per_rank=1 * GB)
    budget = plan_burst(shape, storage, Schedule(interval_s=interval_s, mode=mode))
    return budget, plan_pace(shape, storage, budget, pace, store_share=share)


def test_paced_demand_is_the_jobs_bytes_over_the_paced_window() -> None:
    # bench/bench_pace.py imports this name with this signature to hold the planner against the engine.
    assert list(inspect.signature(paced_demand).parameters) == ["job_bytes", "interval_s", "fraction"]
    assert paced_demand(8 * 10**9, interval_s=100.0, fraction=0.5) == pytest.approx(8e9 / 50.0)
    assert paced_demand(8 * 10**9, interval_s=100.0, fraction=1.0) == pytest.approx(8e9 / 100.0)
    for bad in ({"interval_s": 0.0, "fraction": 0.5}, {"interval_s": 10.0, "fraction": 0.0},
                {"interval_s": 10.0, "fraction": 1.5}):
        with pytest.raises(ConfigError):
            paced_demand(10, **bad)


def test_the_burst_is_bounded_by_the_store_and_by_the_writers_caps() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=1 * GB)
    assert peak_demand(shape, StoreLimits(write_bytes_per_s=10 * GB)) == pytest.approx(10 * GB)
    # Eight writers of 0.5 GB/s each cannot fill a 10 GB/s store.
    capped = StoreLimits(write_bytes_per_s=10 * GB, per_writer_bytes_per_s=0.5 * GB)
    assert peak_demand(shape, capped) == pytest.approx(4 * GB)


def test_auto_spreads_the_job_over_the_fraction_of_the_interval_and_lags_by_the_window() -> None:
    budget, p = _plan(StoreLimits(write_bytes_per_s=10 * GB), FlushPace(pace="auto", fraction=0.5))
    assert p.peak_demand_bytes_per_s == pytest.approx(10 * GB)
    assert p.paced_demand_bytes_per_s == pytest.approx(8 * GB / 50.0)
    assert p.unpaced_lag_s == pytest.approx(budget.flush_s) == pytest.approx(0.8)
    assert p.paced_lag_s == pytest.approx(50.0)  # the window: half the interval
    # A pace only slows writers down: on a store slower than the pace the lag is the unpaced flush.
    _, slow = _plan(StoreLimits(write_bytes_per_s=0.1 * GB), FlushPace(pace="auto", fraction=0.5))
    assert slow.paced_lag_s == pytest.approx(80.0) and slow.paced_demand_bytes_per_s == pytest.approx(0.1 * GB)


def test_a_paced_save_durable_later_costs_more_work_per_failure() -> None:
    """Until a paced save is durable a failure restarts from the one before: the lag replaces the flush."""
    budget, p = _plan(StoreLimits(write_bytes_per_s=10 * GB), FlushPace(pace="auto", fraction=0.5))
    assert p.paced_expected_lost_work_s - budget.expected_lost_work_s == pytest.approx(50.0 - 0.8)
    # A window cut short by the next save: at most a whole cycle more, never a lag past it.
    _, late = _plan(StoreLimits(write_bytes_per_s=10 * GB), FlushPace(pace=0.01 * GB, ranks_per_node=8))
    cycle = budget.interval_s + budget.stall_s_per_checkpoint
    assert late.paced_expected_lost_work_s == pytest.approx(cycle / 2 + cycle)
    unpaced_equivalent = _plan(StoreLimits(write_bytes_per_s=0.1 * GB), FlushPace(pace="auto", fraction=0.5))
    assert unpaced_equivalent[1].paced_expected_lost_work_s == pytest.approx(
        unpaced_equivalent[0].expected_lost_work_s)  # a store slower than the pace: the lag is the flush


def test_a_node_budget_is_shared_by_the_ranks_of_the_node() -> None:
    _, p = _plan(StoreLimits(write_bytes_per_s=10 * GB), FlushPace(pace=0.8 * GB, ranks_per_node=4))
    # 8 ranks on 2 nodes: 0.2 GB/s a writer, 1.6 GB/s the job; each rank's 1 GB takes 5 s.
    assert p.paced_demand_bytes_per_s == pytest.approx(1.6 * GB)
    assert p.paced_lag_s == pytest.approx(5.0)


def test_a_window_past_the_next_save_is_cut_short_by_it() -> None:
    # 10 MB/s a writer: 100 s for its 1 GB, but saves come every 40 s; the rest goes at full speed.
    budget, p = _plan(StoreLimits(write_bytes_per_s=10 * GB), FlushPace(pace=80e6, ranks_per_node=8),
                      interval_s=40.0)
    assert p.paced_lag_s == pytest.approx(40.0 + 0.6 * budget.flush_s)


def test_auto_is_recommended_when_only_the_paced_demand_fits_the_share() -> None:
    store = StoreLimits(write_bytes_per_s=10 * GB)
    _, unpaced = _plan(store, FlushPace(), share=0.25)
    assert unpaced.flush_pace is None and unpaced.recommended_flush_pace == "auto"
    assert unpaced.store_share_bytes_per_s == pytest.approx(2.5 * GB)
    assert unpaced.paced_demand_bytes_per_s == unpaced.auto_demand_bytes_per_s == pytest.approx(8 * GB / 50.0)
    # Already paced, no share, a whole store, a sync save, or a share nothing fits: no recommendation.
    assert _plan(store, FlushPace(pace="auto"), share=0.25)[1].recommended_flush_pace is None
    assert _plan(store, FlushPace(), share=None)[1].recommended_flush_pace is None
    assert _plan(store, FlushPace(), share=1.0)[1].recommended_flush_pace is None
    assert _plan(store, FlushPace(), share=0.25, mode="sync")[1].recommended_flush_pace is None
    assert _plan(store, FlushPace(), share=0.001)[1].recommended_flush_pace is None
    # A node budget too generous for the share: auto would fit.
    generous = _plan(store, FlushPace(pace=40 * GB), share=0.25)[1]
    assert generous.paced_demand_bytes_per_s > 2.5 * GB and generous.recommended_flush_pace == "auto"


@pytest.mark.parametrize("kwargs", [{"pace": 0.0}, {"pace": "fast"}, {"pace": float("inf")}, {"fraction": 0.0},
                                    {"fraction": 1.01}, {"ranks_per_node": 0}])
def test_a_bad_pace_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        FlushPace(**kwargs)  # type: ignore[arg-type]
