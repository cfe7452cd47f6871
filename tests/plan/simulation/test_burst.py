"""The simulator: agrees with the planner when nothing contends, and shows what the planner hides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptio._cli.main import main
from ckptio.errors import ConfigError
from ckptio.obs.events import EVENTS
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import Parallelism, shape_checkpoint, uniform_shape
from ckptio.plan.job.presets import PRESETS
from ckptio.plan.simulation.burst import SimulationConfig, simulate
from ckptio.plan.simulation.simulation_events import simulation_events, write_events

GB = 1e9


@pytest.mark.parametrize(
    ("preset", "storage"),
    [
        ("mlperf-llama3-8b", StoreLimits(write_bytes_per_s=10 * GB, per_writer_bytes_per_s=2 * GB)),
        ("mlperf-llama3-70b", StoreLimits(write_bytes_per_s=50 * GB, per_writer_bytes_per_s=0.5 * GB)),
        ("mlperf-llama3-405b", StoreLimits(write_bytes_per_s=1e12, metadata_ops_per_s=5000)),
        ("mlperf-llama3-1t", StoreLimits(write_bytes_per_s=2e12, kind="object", prefixes=16)),
        ("mlperf-llama3-8b", StoreLimits(write_bytes_per_s=10 * GB, serialize_bytes_per_s=1 * GB)),
    ],
)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_uncontended_flush_matches_the_plan_within_5_percent(
    preset: str, storage: StoreLimits, mode: str
) -> None:
    shape = shape_checkpoint(PRESETS[preset].spec())
    schedule = Schedule(interval_s=4 * 3600, mode=mode)  # type: ignore[arg-type]
    plan = plan_burst(shape, storage, schedule)
    result = simulate(shape, storage, schedule, SimulationConfig(checkpoints=5, mode=mode))  # type: ignore[arg-type]
    assert result.flush_s == pytest.approx(plan.flush_s, rel=0.05)
    assert result.plan_flush_s == plan.flush_s
    assert result.keeps_up and result.skipped == 0
    expected_stall = plan.sync_stall_s if mode == "sync" else plan.blocking_s
    assert result.stall_s_per_checkpoint == pytest.approx(expected_stall, rel=0.05)


def test_16384_ranks_fold_into_a_few_classes() -> None:
    model = PRESETS["mlperf-llama3-405b"].spec(
        parallelism=Parallelism.for_ranks(ranks=16384, tp=8, pp=32, zero=1)
    )
    shape = shape_checkpoint(model)
    assert shape.ranks == 16384 and len(shape.classes) <= 16
    storage = StoreLimits(write_bytes_per_s=2e12, per_writer_bytes_per_s=2 * GB)
    result = simulate(
        shape,
        storage,
        Schedule(interval_s=1800),
        SimulationConfig(checkpoints=100, loader_read_bytes_per_s=1e12),
    )
    assert result.checkpoints == 100 and len(result.records) == 100
    assert all(r.committed_s is not None for r in result.records)
    # the loader's reads share the store, so the flush is slower than the closed form
    assert result.flush_s > result.plan_flush_s


def test_a_flush_longer_than_the_interval_blocks_each_save_by_the_difference() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=1.0 * GB)  # 4 GB a save
    storage = StoreLimits(write_bytes_per_s=0.1 * GB)  # 40 s flush
    schedule = Schedule(interval_s=30, save_cost_s=1.0)
    result = simulate(shape, storage, schedule, SimulationConfig(checkpoints=6))
    assert not result.keeps_up and result.skipped == 0
    steady = result.records[2:]
    assert all(r.queue_depth == 1 for r in steady)
    assert all(r.stall_s == pytest.approx(1.0 + 40 - 30) for r in steady)
    assert all(r.flush_s == pytest.approx(40.0) for r in steady)
    # blocking bounds the lag: once the queue is full it stays flat
    assert len({round(r.lag_s or 0, 6) for r in steady}) == 1
    assert result.host_staging_bytes_per_rank == pytest.approx(1 * GB)


def test_skip_drops_every_other_save_when_the_flush_takes_one_and_a_half_intervals() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=1.0 * GB)
    result = simulate(
        shape,
        StoreLimits(write_bytes_per_s=0.1 * GB),
        Schedule(interval_s=30, save_cost_s=0.5),
        SimulationConfig(checkpoints=8, overflow="skip"),
    )
    assert [r.skipped for r in result.records] == [False, True] * 4
    assert result.skipped == 4
    assert result.stall_s_per_checkpoint == pytest.approx(0.5 * 4 / 8)


def test_more_slots_let_the_queue_and_the_lag_grow_one_save_at_a_time() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=1.0 * GB)
    result = simulate(
        shape,
        StoreLimits(write_bytes_per_s=0.1 * GB),
        Schedule(interval_s=30, save_cost_s=0.0),
        SimulationConfig(checkpoints=6, max_pending=4),
    )
    lags = [r.lag_s for r in result.records]
    assert lags == sorted(lags) and lags[-1] > lags[0] + 40  # +10 s per save
    assert result.lag_growth_s_per_checkpoint == pytest.approx(10.0, rel=0.01)
    # 40 s flushes every 30 s: one more save waits every three saves
    assert [r.queue_depth for r in result.records] == [0, 1, 1, 1, 1, 2]
    assert result.queue_depth_max == 2
    assert result.host_staging_bytes_per_rank == pytest.approx(3 * GB)


def test_the_loader_and_the_flush_slow_each_other() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=1.0 * GB)
    storage = StoreLimits(write_bytes_per_s=4 * GB)
    schedule = Schedule(interval_s=60, save_cost_s=0.1)
    quiet = simulate(shape, storage, schedule, SimulationConfig(checkpoints=4))
    busy = simulate(shape, storage, schedule, SimulationConfig(checkpoints=4, loader_read_bytes_per_s=3 * GB))
    # 16 flows share 4 GB/s: writers get 2 GB/s (flush 4 s instead of 2 s), loaders 2 of their 3 GB/s
    assert quiet.flush_s == pytest.approx(2.0)
    assert busy.flush_s == pytest.approx(4.0)
    assert busy.loader_slowdown_fraction > 0
    assert busy.gpu_idle_fraction > quiet.gpu_idle_fraction


def test_tiered_frees_the_slot_after_the_local_write_and_drains_behind() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=1.0 * GB)
    config = SimulationConfig(
        checkpoints=4, mode="tiered", local_bytes_per_s=8 * GB, local_capacity_bytes=64 * GB, ranks_per_node=8
    )
    result = simulate(
        shape, StoreLimits(write_bytes_per_s=1 * GB), Schedule(interval_s=10, save_cost_s=0.1), config
    )
    # local: 8 ranks × 1 GB at 8 GB/s per node = 1 s; drain 8 GB at 1 GB/s = 8 s; flush = 9 s < interval
    assert result.records[0].flush_s == pytest.approx(9.0)
    assert result.keeps_up
    assert result.stall_s_per_checkpoint == pytest.approx(0.1)
    phases = {p for r in result.records for _, p, _, _ in r.phases}
    assert phases == {"local_write", "upload"}


def test_a_full_local_tier_backs_up_into_the_staging_slots() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=1.0 * GB)
    config = SimulationConfig(
        checkpoints=6, mode="tiered", local_bytes_per_s=80 * GB, local_capacity_bytes=8 * GB, ranks_per_node=8
    )
    # drain 16 s > interval 10 s, and the local tier holds one save: the next waits for the drain
    result = simulate(
        shape, StoreLimits(write_bytes_per_s=0.5 * GB), Schedule(interval_s=10, save_cost_s=0), config
    )
    assert not result.keeps_up
    assert max(r.stall_s for r in result.records) > 1.0


def test_a_local_tier_smaller_than_one_save_is_a_config_error() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=1.0 * GB)
    config = SimulationConfig(mode="tiered", local_bytes_per_s=GB, local_capacity_bytes=GB, ranks_per_node=8)
    with pytest.raises(ConfigError, match="cannot hold"):
        simulate(shape, StoreLimits(write_bytes_per_s=GB), Schedule(interval_s=10), config)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"checkpoints": 0},
        {"mode": "lazy"},
        {"max_pending": 0},
        {"overflow": "drop"},
        {"loader_read_bytes_per_s": -1},
        {"mode": "tiered"},
        {"mode": "tiered", "local_bytes_per_s": 1.0, "local_capacity_bytes": 0.0},
    ],
)
def test_bad_simulation_configs(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SimulationConfig(**kwargs)  # type: ignore[arg-type]


def test_events_follow_the_schema_and_the_report_draws_them(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ckptio.obs.report import load_events, write_report

    shape = uniform_shape(ranks=4, bytes_per_rank=0.5 * GB)
    result = simulate(
        shape,
        StoreLimits(write_bytes_per_s=0.1 * GB),
        Schedule(interval_s=20, step_time_s=1.0, save_cost_s=0.5),
        SimulationConfig(checkpoints=5, overflow="skip"),
    )
    records = simulation_events(result, shape, step_time_s=1.0)
    assert {r["event"] for r in records} <= EVENTS
    assert sum(r["event"] == "save_skipped" for r in records) == result.skipped
    committed = [r for r in records if r["event"] == "committed"]
    assert len(committed) == sum(r.committed_s is not None for r in result.records)
    assert any(r["event"] == "step_end" for r in records)
    path = tmp_path / "sim.jsonl"
    write_events(records, path)
    assert len(load_events([str(path)])) == len(records)
    summary = write_report(records, str(tmp_path / "sim.png"))
    assert (tmp_path / "sim.png").stat().st_size > 0
    assert summary is not None


def test_cli_json_keys_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events.jsonl"
    rc = main(
        [
            "simulate",
            "--params",
            "1B",
            "--ranks",
            "4",
            "--zero",
            "3",
            "--write-bandwidth",
            "200MB/s",
            "--interval",
            "30s",
            "--checkpoints",
            "5",
            "--mode",
            "async",
            "--overflow",
            "skip",
            "--json",
            "--events",
            str(events),
        ]
    )
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("flush_s", "stall_s_per_checkpoint", "keeps_up", "skipped", "gpu_idle_hours_per_day"):
        assert key in result
    assert result["skipped"] > 0 and result["keeps_up"] is False
    assert len(result["records"]) == 5
    assert events.stat().st_size > 0


def test_cli_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "simulate",
            "--preset",
            "mlperf-llama3-8b",
            "--write-bandwidth",
            "10GB/s",
            "--interval",
            "30m",
            "--checkpoints",
            "3",
            "--mode",
            "sync",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "ckptio simulate (sync)" in text and "keeps up" in text


@pytest.mark.parametrize(
    "extra",
    [
        ["--mode", "tiered"],  # no local tier
        ["--checkpoints", "0"],
        ["--loader-read-bandwidth", "lots"],
        ["--local-capacity=-1GB", "--local-bandwidth", "1GB/s", "--mode", "tiered"],
    ],
)
def test_cli_bad_arguments_exit_2(extra: list[str]) -> None:
    argv = ["simulate", "--params", "1B", "--write-bandwidth", "1GB/s", "--interval", "1h", *extra]
    assert main(argv) == 2
