"""The cluster demo's figures from hand-made rank records: what each definition counts (no lab needed)."""

from __future__ import annotations

import pytest

from ckptio.demo.cluster.cpu import cpu_seconds, save_cpu
from ckptio.demo.cluster.figures import (
    RECOVERY_PHASES,
    pacing_figures,
    queued_flush_s,
    recovery_figures,
    train_figures,
)
from ckptio.demo.cluster.matrix import StoreBytes
from ckptio.demo.cluster.outcome import ClusterConfig
from ckptio.demo.cluster.runner import durable_steps
from ckptio.errors import ConfigError


def _record(offset: float) -> dict:
    # calm: steps of 0.1 s with 10 ms all-reduces; then saves at 2 and 4 (every 2); step 2 costs 0.3 s more.
    steps = [{"step": i, "t": 10.0 + i, "s": 0.1 + (0.3 if i == 2 else 0.0), "reduce_s": 0.02 if i in (2, 3) else 0.01,
              "in_flight": i in (2, 3)} for i in range(1, 6)]
    saves = [{"step": 2, "requested": 12.0 + offset, "returned": 12.0, "durable": 13.0 + offset},
             {"step": 4, "requested": 14.0, "returned": 14.0, "durable": 16.0}]
    return {"calm": [{"s": 0.1, "reduce_s": 0.01}] * 5, "calm_span": [5.0, 9.0], "steps": steps, "saves": saves}


def test_train_figures_follow_their_definitions() -> None:
    loaders = [[{"t": 6.0, "mbit": 100.0}, {"t": 12.5, "mbit": 40.0}, {"t": 17.0, "mbit": 100.0}]]
    f = train_figures([_record(0.0), _record(0.5)], loaders, every=2)
    assert f.clean_step_s == pytest.approx(0.1)
    assert f.lost_per_save_s == pytest.approx(0.15)  # 0.3 s on one save, 0 on the other: the median of two
    assert f.flush_s == pytest.approx(1.75)  # first request → last durable: step 2 12 → 13.5, step 4 14 → 16
    assert f.lag_max_s == pytest.approx(2.0)
    assert f.allreduce_slowdown == pytest.approx(1.0)  # 20 ms while a save flies, 10 ms calm
    assert f.loader_calm_mbit == [100.0] and f.loader_saving_mbit == [40.0]


def test_only_the_durable_saves_count_as_flushes() -> None:
    f = train_figures([_record(0.0)], [[]], every=2, durable={4})
    assert f.flush_s == pytest.approx(2.0)


def test_recovery_phases_add_up_from_the_kill() -> None:
    times = {"launched": 101.0, "started": 101.5, "imported": 104.0, "process_group": 104.5, "checkpointer": 106.0,
             "restore": 107.0, "first_step": 107.2}
    ranks = [{"times": times, "step": 8, "level": "local", "sources": {"local": 2}},
             {"times": {**times, "restore": 107.5, "first_step": 107.6}, "step": 8, "level": "local",
              "sources": {"partner": 2}}]
    rec = recovery_figures(100.0, 101.0, ranks)
    assert list(rec.phases) == list(RECOVERY_PHASES)
    assert rec.phases["relaunch"] == 1.0 and rec.phases["restore"] == pytest.approx(1.5)  # the slowest rank's
    assert sum(rec.phases.values()) == pytest.approx(rec.total_s) == pytest.approx(7.6)
    assert rec.sources == {"local": 2, "partner": 2} and rec.restored_step == 8


def test_the_durable_saves_are_every_kth_call_counting_the_untimed_first() -> None:
    assert durable_steps(ClusterConfig(every=10, saves=4, durable_every=2)) == {10, 30}
    with pytest.raises(ConfigError):
        ClusterConfig(nodes=1)
    with pytest.raises(ConfigError):
        ClusterConfig(lost_node=0)


def test_pacing_figures_read_the_rates_the_writers_applied() -> None:
    events = [{"event": "phase", "phase": "replicate", "bytes": 20_000_000, "seconds": 2.0},
              {"event": "phase", "phase": "replicate", "bytes": 0, "seconds": 0.0},  # no partner answered: no rate
              {"event": "phase", "phase": "write", "bytes": 10, "seconds": 1.0},
              {"event": "flush_paced", "target_bytes_per_s": 5e6, "achieved_bytes_per_s": 4e6, "hurried": False},
              {"event": "flush_paced", "target_bytes_per_s": 5e6, "achieved_bytes_per_s": 9e6, "hurried": True}]
    p = pacing_figures(events)
    assert p.partner_bytes_per_s == [1e7]
    assert p.paced_flushes == 2 and p.hurried == 1 and p.flush_achieved_bytes_per_s == [4e6, 9e6]


def test_the_paced_run_stretches_its_interval_until_a_durable_save_fits_the_pace() -> None:
    config = ClusterConfig(every=10, node_mbit=400.0, pace_share=0.25, state_mib=16.0)
    # A durable save moves 2 × 16 MiB across the node link at 12.5 MB/s: 2.68 s, × 1.25 = 3.36 s = 34 steps of 0.1 s.
    assert config.paced_every(0.1) == 34
    assert config.paced_every(10.0) == 10  # never shorter than the demo's own interval


def test_store_bytes_hold_the_checkpoints_against_what_crossed_the_link() -> None:
    carried = StoreBytes(written=3 << 20, read=0, checkpoints=float(4 << 20))
    assert carried.written_share == pytest.approx(0.75)  # a store that skipped a quarter of the bytes shows < 1


def test_save_cpu_charges_the_writers_and_the_client_beyond_its_calm_rate() -> None:
    # (t, writers' CPU, client's CPU): calm 0-10 s with the client at 0.1 CPU s/s (a loader's reads); saves 10-20 s.
    samples = [(0.0, 0.0, 0.0), (10.0, 0.0, 1.0), (20.0, 4.0, 5.0)]
    cpu = save_cpu(samples, calm=(0.0, 10.0), saving=(10.0, 20.0), saves=2, nodes=2)
    assert cpu is not None
    assert cpu.writer_s == pytest.approx(1.0)  # 4 CPU s over 2 saves and 2 nodes
    assert cpu.client_s == pytest.approx(0.75)  # 4 CPU s less 1 s the loader would have taken anyway, ÷ 4
    assert save_cpu(samples[:1], calm=(0.0, 10.0), saving=(10.0, 20.0), saves=2, nodes=2) is None


def test_cpu_seconds_of_this_process_grow_and_a_gone_pid_reads_zero() -> None:
    import os

    first = cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu_seconds(os.getpid()) > first
    assert cpu_seconds(2**22 + 17) == 0.0  # above pid_max's default ceiling: never a live process


def test_a_queued_flush_is_the_gap_between_durable_saves() -> None:
    ranks = [{"saves": [{"step": 3, "durable": 10.0}, {"step": 6, "durable": 12.0}, {"step": 9, "durable": 14.5},
                        {"step": 12, "durable": None}, {"step": 15, "durable": 30.0}]},
             {"saves": [{"step": 3, "durable": 10.5}, {"step": 6, "durable": 12.0}, {"step": 9, "durable": 14.0},
                        {"step": 12, "durable": 16.0}, {"step": 15, "durable": 30.0}]}]
    assert queued_flush_s(ranks) == pytest.approx(2.0)  # 10.5 → 12 → 14.5: gaps 1.5 and 2.5; step 12 ends it
