"""The simulator's paced writers: each rank's upload held to its paced rate, so the store's peak falls to the model's
paced demand, and a later save sends the flush in progress to full speed as the engine's writer does."""

from __future__ import annotations

import pytest

from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.pace import FlushPace, paced_demand, plan_pace
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import Parallelism, shape_checkpoint, uniform_shape
from ckptio.plan.job.presets import PRESETS
from ckptio.plan.simulation.burst import SimulationConfig, simulate

GB = 1e9


def test_at_16384_ranks_a_paced_jobs_peak_falls_to_the_models_paced_demand() -> None:
    model = PRESETS["mlperf-llama3-405b"].spec(parallelism=Parallelism.for_ranks(ranks=16384, tp=8, pp=32, zero=1))
    shape = shape_checkpoint(model)
    assert shape.ranks == 16384
    storage = StoreLimits(write_bytes_per_s=2e12, per_writer_bytes_per_s=2 * GB)
    schedule = Schedule(interval_s=1800)
    budget = plan_burst(shape, storage, schedule)
    peaks = {}
    for name, pace in (("none", FlushPace()), ("auto", FlushPace(pace="auto", fraction=0.5)),
                       ("node", FlushPace(pace=0.25 * GB, ranks_per_node=8))):
        result = simulate(shape, storage, schedule,
                          SimulationConfig(checkpoints=3, pace=pace if pace.pace is not None else None))
        plan = plan_pace(shape, storage, budget, pace)
        peaks[name] = result.peak_store_demand_bytes_per_s
        assert result.keeps_up and all(r.committed_s is not None for r in result.records), name
        if name == "none":
            assert peaks[name] == pytest.approx(plan.peak_demand_bytes_per_s, rel=1e-6)  # the whole store
            assert result.flush_s == pytest.approx(budget.flush_s, rel=0.01)
        else:
            assert peaks[name] == pytest.approx(plan.paced_demand_bytes_per_s, rel=1e-6), name
            assert result.flush_s == pytest.approx(plan.paced_lag_s, rel=0.01), name
    # The burst of 16,384 ranks at full speed is the store's 2 TB/s; auto spreads 5.3 TiB over 15 minutes.
    assert peaks["none"] == pytest.approx(2e12, rel=1e-6)
    assert peaks["auto"] == pytest.approx(paced_demand(round(shape.total_bytes), interval_s=1800, fraction=0.5),
                                          rel=1e-6)
    assert peaks["auto"] < peaks["none"] / 100
    assert peaks["node"] == pytest.approx(0.25 * GB * 16384 / 8, rel=1e-6)  # 0.25 GB/s for each of 2,048 nodes


def test_the_next_save_sends_a_slow_paced_flush_to_full_speed() -> None:
    # 4 ranks of 1 GB at 10 MB/s each: a 100 s window, but saves come every 30 s. Hurried at the next save, the
    # rest (0.7 GB a rank) goes at the store's 1 GB/s a writer: each flush lasts 30 s + 2.8 s.
    shape = uniform_shape(ranks=4, bytes_per_rank=1 * GB)
    storage = StoreLimits(write_bytes_per_s=4 * GB)
    schedule = Schedule(interval_s=30, save_cost_s=0.0)
    pace = FlushPace(pace=40e6, ranks_per_node=4)
    result = simulate(shape, storage, schedule, SimulationConfig(checkpoints=4, pace=pace))
    flushes = [r.flush_s for r in result.records[:-1]]
    assert flushes == pytest.approx([30.0 + 0.7 * 1.0] * 3, rel=1e-3)
    assert result.records[-1].flush_s == pytest.approx(100.0, rel=1e-3)  # the last save: nothing hurries it
    budget = plan_burst(shape, storage, schedule)
    assert plan_pace(shape, storage, budget, pace).paced_lag_s == pytest.approx(30.7, rel=1e-3)


def test_a_synchronous_save_is_never_paced() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=1 * GB)
    storage = StoreLimits(write_bytes_per_s=4 * GB)
    schedule = Schedule(interval_s=30, save_cost_s=0.0, mode="sync")
    paced = simulate(shape, storage, schedule, SimulationConfig(checkpoints=2, mode="sync",
                                                                  pace=FlushPace(pace="auto")))
    assert paced.peak_store_demand_bytes_per_s == pytest.approx(4 * GB)
    assert paced.stall_s_per_checkpoint == pytest.approx(1.0)
