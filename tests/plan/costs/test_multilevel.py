"""The two-level plan: ``plan --json``'s contract keys, the figure's inputs, monotonicity, and bad inputs.

The model is :mod:`ckptio.plan.costs.multilevel` (Di et al., IPDPS 2014); its agreement with injected failures is
``test_failsim.py``'s.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from ckptio._cli.main import main
from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.levels import JOB_LOSS_SHARE, NODE_LOSS_SHARE, LocalLevel, failure_rates
from ckptio.plan.costs.multilevel import LevelSchedule, expected_loss, plan_two_levels
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import shape_checkpoint, uniform_shape
from ckptio.plan.job.presets import preset

GIB = float(1 << 30)
# The figure: Llama 3 405B on 512 ranks, MTBF 3 h, durable 150 GiB/s, local 5 GB/s per node.
FIGURE = ("--preset", "mlperf-llama3-405b", "--ranks", "512", "--mtbf", "3h", "--write-bandwidth", "150GiB/s",
          "--read-bandwidth", "150GiB/s", "--local-bandwidth", "5GB/s")


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_json_has_the_two_level_contract_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, *FIGURE)
    for key in ("lost_gpu_hours_per_day_single", "lost_gpu_hours_per_day_two_level", "local_interval_s",
                "durable_interval_s"):
        assert isinstance(out[key], float) and out[key] > 0, key
    restore = out["restore_s"]
    assert set(restore) == {"local", "partner", "durable"}
    # ZeRO-1 over two DP replicas, each holding a copy of the other's node (one partner): each rank of a node reads
    # half its stage's weights and its own optimizer shard from its tier at 5 GB/s (8 ranks), and receives the
    # other half over the 25 GB/s NIC; a partner serves a lost node's bytes besides its own restore, and the lost
    # node's replacement receives them; every byte of the durable tier is read once, all ranks at once.
    groups = shape_checkpoint(preset("mlperf-llama3-405b").spec()).groups
    node_read = 8 * max(g.shared_bytes / 2 + g.own_bytes for g in groups)
    node_received = 8 * max(g.shared_bytes / 2 for g in groups)
    assert restore["local"] == pytest.approx(max(node_read / 5e9, node_received / 25e9), rel=1e-3)
    node_bytes = 8 * out["bytes_per_rank_max"]
    assert restore["partner"] == pytest.approx(
        max(restore["local"], (node_read + node_bytes) / 5e9, (node_received + node_bytes) / 25e9), rel=1e-3)
    assert restore["durable"] == pytest.approx(out["checkpoint_bytes"] / (150 * GIB), rel=0.05)
    assert out["durable_interval_s"] == pytest.approx(out["durable_every"] * out["local_interval_s"])
    assert "Di et al." in out["levels"]["model"]
    assert out["modes"] and out["verdict"] in ("ok", "warn", "fail")  # the budget's keys are all still there


def test_the_figures_inputs_lose_fewer_gpu_hours_with_two_levels(capsys: pytest.CaptureFixture[str]) -> None:
    free = _plan(capsys, *FIGURE)
    assert free["lost_gpu_hours_per_day_two_level"] < free["lost_gpu_hours_per_day_single"]
    # With the store's share held to 5%, one level must save rarely; two levels keep saving locally often.
    held = _plan(capsys, *FIGURE, "--durable-share", "0.05")
    assert held["lost_gpu_hours_per_day_two_level"] < 0.7 * held["lost_gpu_hours_per_day_single"]
    assert held["local_interval_s"] < held["durable_interval_s"] <= 1.01 * held["single_level_interval_s"]
    for plan in (held["levels"]["single"], held["levels"]["two_level"]):
        assert plan["durable_store_share"] <= 0.05 + 1e-9


def test_the_human_plan_prints_both_levels(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *FIGURE]) == 0
    out = capsys.readouterr().out
    assert "single level" in out and "two levels" in out and "GPU-h lost/day" in out


def _lost(*, replicas: int = 1, local: float = 5e9, mtbf_h: float = 3.0, share: float = 0.05) -> tuple[float, float]:
    shape = uniform_shape(ranks=64, bytes_per_rank=8 * GIB)
    storage = StoreLimits(write_bytes_per_s=20 * GIB, read_bytes_per_s=20 * GIB)
    schedule = Schedule(mtbf_s=mtbf_h * 3600)
    budget = plan_burst(shape, storage, schedule)
    plan = plan_two_levels(shape, storage, schedule, budget, local=LocalLevel(bytes_per_s=local, replicas=replicas),
                           durable_share=share)
    assert plan.two_level is not None
    return plan.single.gpu_hours_per_day(64), plan.two_level.gpu_hours_per_day(64)


def test_a_partner_copy_faster_local_tiers_and_a_longer_mtbf_each_lose_fewer_hours() -> None:
    _, none = _lost(replicas=0)
    _, one = _lost(replicas=1)
    assert one < none  # node losses restore from a partner instead of the rare durable save
    _, slow = _lost(local=2e9)
    _, fast = _lost(local=20e9)
    assert fast < slow
    for longer, shorter in zip(_lost(mtbf_h=12.0), _lost(mtbf_h=3.0), strict=True):
        assert longer < shorter


def test_more_replicas_cover_more_node_losses_and_restore_faster_but_write_more() -> None:
    shape = uniform_shape(ranks=64, bytes_per_rank=8 * GIB)
    levels = [LocalLevel(bytes_per_s=5e9, replicas=r) for r in (1, 2, 3)]
    partner = [lv.restore_partner_s(shape) for lv in levels]
    flush = [lv.flush_s(shape) for lv in levels]
    assert partner[0] > partner[1] > partner[2]  # (1 + 1/r) of a node's bytes read per partner
    assert flush[0] < flush[1] < flush[2]  # each node writes (1 + r) nodes' bytes: the price of a replica
    rates = failure_rates(mtbf_s=3600.0, nodes=8, node_mtbf_s=16 * 3600.0)
    assert rates.partner_coverage(0, 600) == 0.0
    assert rates.partner_coverage(1, 600) < rates.partner_coverage(2, 600) < 1.0


def test_the_failure_classes_split_the_jobs_mtbf() -> None:
    rates = failure_rates(mtbf_s=10800.0, nodes=64)
    assert rates.total == pytest.approx(1 / 10800.0)
    assert rates.node == pytest.approx(NODE_LOSS_SHARE / 10800.0)
    assert rates.job == pytest.approx(JOB_LOSS_SHARE / 10800.0)
    assert rates.node_mtbf_s == pytest.approx(64 * 10800.0 / NODE_LOSS_SHARE)
    given = failure_rates(mtbf_s=10800.0, nodes=64, node_mtbf_s=64 * 21600.0, job_loss_mtbf_s=108000.0)
    assert given.node == pytest.approx(1 / 21600.0) and given.soft == pytest.approx(1 / 10800 - 1 / 21600 - 1 / 108000)
    with pytest.raises(ConfigError, match="more than --mtbf"):
        failure_rates(mtbf_s=10800.0, nodes=64, node_mtbf_s=3600.0)
    # A default MTBF gives way to explicit class rates.
    assert failure_rates(mtbf_s=10800.0, nodes=64, node_mtbf_s=3600.0, mtbf_given=False).total > 1 / 10800.0


def test_one_level_loses_what_the_budget_says_plus_the_restore() -> None:
    shape = uniform_shape(ranks=16, bytes_per_rank=2 * GIB)
    storage = StoreLimits(write_bytes_per_s=4 * GIB, read_bytes_per_s=8 * GIB)
    schedule = Schedule(interval_s=900.0, mtbf_s=6 * 3600.0)
    budget = plan_burst(shape, storage, schedule)
    plan = plan_two_levels(shape, storage, schedule, budget, local=None)
    assert plan.two_level is None and plan.single.schedule.local_interval_s == 900.0
    for cls in plan.single.classes.values():
        assert cls["lost_work_s"] == pytest.approx(budget.expected_lost_work_s)
        assert cls["restore_s"] == pytest.approx(budget.restore_s["durable"])


def test_a_given_schedule_is_evaluated_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, *FIGURE, "--local-every", "5m", "--durable-every", "4")
    assert out["local_interval_s"] == 300.0 and out["durable_every"] == 4 and out["durable_interval_s"] == 1200.0
    steps = _plan(capsys, *FIGURE, "--step-time", "10", "--local-every", "12")
    assert steps["local_interval_s"] == 120.0


def test_saves_every_k_alike_cost_the_same_in_closed_form() -> None:
    # k = 1000 costs what k = 3 costs (saves 2..k-1 are one group), and more saves per pattern cost more stalls.
    shape = uniform_shape(ranks=8, bytes_per_rank=GIB)
    storage = StoreLimits(write_bytes_per_s=GIB)
    budget = plan_burst(shape, storage, Schedule(mtbf_s=36000.0))
    plan = plan_two_levels(shape, storage, Schedule(mtbf_s=36000.0), budget, local=LocalLevel(bytes_per_s=5e9))
    loss = expected_loss(plan.times, plan.rates, 1, LevelSchedule(local_interval_s=60.0, durable_every=1000))
    assert loss.pattern_s == pytest.approx(1000 * 60.0 + 1000 * loss.stall_s_per_save)
    assert math.isfinite(loss.lost_fraction) and 0 < loss.lost_fraction < 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--replicas=-1",), "--replicas must be >= 0"),
        (("--replicas", "two"), "--replicas takes a whole number"),
        (("--node-mtbf", "0"), "--node-mtbf must be a positive duration"),
        (("--node-mtbf=-3h",), "--node-mtbf"),
        (("--job-loss-mtbf", "0s"), "--job-loss-mtbf must be a positive duration"),
        (("--durable-share", "0"), "--durable-share must be within"),
        (("--durable-every", "0"), "--durable-every must be >= 1"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_bad_two_level_inputs_exit_2_with_the_flag_named(capsys: pytest.CaptureFixture[str], command: str,
                                                         argv: tuple[str, ...], message: str) -> None:
    base = ["--preset", "mlperf-llama3-8b", "--write-bandwidth", "10GB/s", "--local-bandwidth", "5GB/s"]
    extra = ["--checkpoints", "2", "--failures", "10"] if command == "simulate" else []
    assert main([command, *base, *extra, *argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_local_level_values_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="replicas"):
        LocalLevel(bytes_per_s=5e9, replicas=-1)
    with pytest.raises(ConfigError, match="bytes_per_s"):
        LocalLevel(bytes_per_s=0.0)
    with pytest.raises(ConfigError, match="--node-mtbf"):
        failure_rates(mtbf_s=3600.0, nodes=4, node_mtbf_s=0.0)


def test_a_given_local_interval_past_the_horizon_is_still_evaluated() -> None:
    """A given interval longer than every candidate the optimizer would try for k > 1 leaves k = 1, never no
    candidate at all (which once raised ValueError from an empty min())."""
    shape = uniform_shape(ranks=8, bytes_per_rank=GIB)
    storage = StoreLimits(write_bytes_per_s=10 * GIB)
    schedule = Schedule(mtbf_s=3600.0)
    budget = plan_burst(shape, storage, schedule)
    plan = plan_two_levels(shape, storage, schedule, budget, local=LocalLevel(bytes_per_s=5e9), local_interval_s=1e9)
    assert plan.two_level is not None
    assert plan.two_level.schedule.local_interval_s == 1e9 and plan.two_level.schedule.durable_every == 1
    assert math.isfinite(plan.two_level.lost_fraction)
