"""The burst budget: Young and Daly, fair sharing, flush bottlenecks, keeping up, verdicts."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import (
    Schedule,
)
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointSpec, Parallelism, shape_checkpoint, uniform_shape
from ckptio.plan.job.presets import PRESETS

GB = 1e9














def test_per_writer_cap_sets_the_flush_when_writers_are_few() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=1.0 * GB)
    budget = plan_burst(
        shape,
        StoreLimits(write_bytes_per_s=10 * GB, per_writer_bytes_per_s=0.5 * GB),
        Schedule(interval_s=60),
    )
    assert budget.flush_s == pytest.approx(2.0, rel=1e-6)
    assert budget.bottleneck == "per-writer bandwidth"
    assert budget.keeps_up and budget.verdict == "ok" and budget.reasons == []


def test_aggregate_cap_and_blocking_and_sync_stall() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=2.0 * GB)
    storage = StoreLimits(write_bytes_per_s=4 * GB)
    sched = Schedule(interval_s=600, d2h_bytes_per_s=20 * GB)
    b = plan_burst(shape, storage, sched)
    assert b.flush_s == pytest.approx(16 * GB / (4 * GB))
    assert b.blocking_s == pytest.approx(0.1)
    assert b.sync_stall_s == pytest.approx(4.1)
    assert b.stall_s_per_checkpoint == pytest.approx(0.1)
    assert b.overhead_fraction == pytest.approx(0.1 / 600.1)
    # commit lands blocking + flush after the request; failure uniform over the cycle
    assert b.expected_lost_work_s == pytest.approx(600.1 / 2 + 4.1)
    sync = plan_burst(shape, storage, Schedule(interval_s=600, d2h_bytes_per_s=20 * GB, mode="sync"))
    assert sync.keeps_up and sync.stall_s_per_checkpoint == pytest.approx(4.1)
    assert sync.checkpoint_cost_s == pytest.approx(4.1)


def test_writer_serialization_runs_before_the_store() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=1.0 * GB)
    storage = StoreLimits(write_bytes_per_s=4 * GB, serialize_bytes_per_s=0.5 * GB)
    b = plan_burst(shape, storage, Schedule(interval_s=600))
    assert b.flush_s == pytest.approx(1.0 / 0.5 + 4.0 / 4.0)  # serialize the rank's 1 GB, then the burst
    assert b.bottleneck == "writer serialization"
    with pytest.raises(ConfigError):
        StoreLimits(write_bytes_per_s=GB, serialize_bytes_per_s=0)


def test_save_cost_overrides_the_copy_estimate() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=2.0 * GB)
    b = plan_burst(shape, StoreLimits(write_bytes_per_s=4 * GB), Schedule(interval_s=600, save_cost_s=3.0))
    assert b.blocking_s == 3.0
    assert b.young_interval_s == pytest.approx(math.sqrt(2 * 3.0 * b.mtbf_s))


def test_a_flush_longer_than_the_interval_fails_with_what_to_change() -> None:
    shape = shape_checkpoint(PRESETS["mlperf-llama3-405b"].spec())
    b = plan_burst(shape, StoreLimits(write_bytes_per_s=300 * 2**20), Schedule(interval_s=300))
    assert not b.keeps_up
    assert b.verdict == "fail"
    assert b.reason_codes[0] == "flush-behind"
    assert "write bandwidth" in b.reasons[0]
    # steady state with one slot: each save waits for the previous flush
    assert b.stall_s_per_checkpoint == pytest.approx(b.blocking_s + b.flush_s - 300)
    # The verdict is built with the budget and stays with it: nothing can edit one without the other.
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.verdict = "ok"  # type: ignore[misc]


def test_metadata_ops_bound_a_flush_of_many_small_files() -> None:
    model = CheckpointSpec(
        params=1e9,
        weights_dtype="fp32",
        optimizer="none",
        parallelism=Parallelism(dp=1000, zero=3),
        file_size_bytes=2**20,
    )
    shape = shape_checkpoint(model)  # 4 MB per rank → 4 files + index per rank
    b = plan_burst(
        shape, StoreLimits(write_bytes_per_s=100 * GB, metadata_ops_per_s=1000), Schedule(interval_s=3600)
    )
    assert b.bottleneck == "metadata ops"
    assert b.flush_s == pytest.approx(shape.objects * 2 / 1000)


def test_object_store_request_rate_and_prefixes() -> None:
    shape = shape_checkpoint(PRESETS["mlperf-llama3-405b"].spec())
    one = StoreLimits(write_bytes_per_s=2e12, kind="object", prefixes=1)
    b = plan_burst(shape, one, Schedule(interval_s=3600))
    assert b.bottleneck == "request rate"
    assert b.flush_requests_s == pytest.approx(shape.requests / 3500)
    assert "put-rate" in b.reason_codes
    spread = plan_burst(
        shape, StoreLimits(write_bytes_per_s=2e12, kind="object", prefixes=64), Schedule(interval_s=3600)
    )
    assert spread.bottleneck == "aggregate bandwidth"
    assert "put-rate" not in spread.reason_codes


def test_without_an_interval_the_plan_uses_dalys_optimum_in_whole_steps() -> None:
    shape = shape_checkpoint(PRESETS["mlperf-llama3-8b"].spec())
    storage = StoreLimits(write_bytes_per_s=10 * GB)
    b = plan_burst(shape, storage, Schedule(step_time_s=7.0, mtbf_s=86400))
    assert b.interval_source == "daly"
    assert b.interval_steps is not None
    assert b.interval_s == b.interval_steps * 7.0
    assert b.optimal_interval_s <= b.interval_s < b.optimal_interval_s + 7.0


def test_an_interval_far_from_the_optimum_is_a_warning() -> None:
    shape = shape_checkpoint(PRESETS["mlperf-llama3-8b"].spec())
    b = plan_burst(
        shape, StoreLimits(write_bytes_per_s=10 * GB), Schedule(interval_s=24 * 3600, mtbf_s=6 * 3600)
    )
    assert b.keeps_up and b.verdict == "warn"
    assert "interval" in b.reason_codes








def test_the_budget_carries_every_modes_cost_and_a_faster_store_never_loses_more() -> None:
    from ckptio.plan.costs.background import MODES
    from ckptio.plan.costs.inputs import Host

    shape = uniform_shape(ranks=8, bytes_per_rank=4.0 * GB)
    host = Host(cores_per_rank=1.0)
    lost = []
    for bandwidth in (1 * GB, 4 * GB, 16 * GB):
        budget = plan_burst(shape, StoreLimits(write_bytes_per_s=bandwidth), Schedule(interval_s=20), host=host)
        assert sorted(budget.modes) == sorted(MODES)
        lost.append({m: c["lost_per_save_s"] for m, c in budget.modes.items()})
    for mode in MODES:
        series = [run[mode] for run in lost]
        assert series == sorted(series, reverse=True), mode
    assert lost[0]["dcp_sync"] > lost[-1]["dcp_sync"]
    assert lost[0]["ckptio"] > lost[-1]["ckptio"]  # 32 s of flush every 20 s: the next save waits for the slot


def test_the_probes_serialize_rate_is_ckptios_checksum_cost() -> None:
    shape = uniform_shape(ranks=2, bytes_per_rank=1.0 * GB)
    schedule = Schedule(interval_s=600)
    fast = plan_burst(shape, StoreLimits(write_bytes_per_s=GB, serialize_bytes_per_s=100 * GB), schedule)
    slow = plan_burst(shape, StoreLimits(write_bytes_per_s=GB, serialize_bytes_per_s=0.5 * GB), schedule)
    assert slow.modes["ckptio"]["background_cpu_s"] > fast.modes["ckptio"]["background_cpu_s"] + 1.5
    assert slow.modes["dcp_async"] == pytest.approx(fast.modes["dcp_async"])
