"""``ckptio plan``: a plan without a store, the per-mode cost keys and per-level restore times of ``--json``."""

from __future__ import annotations

import json

import pytest

from ckptio._cli.main import main
from ckptio.plan.costs.background import MODES
from ckptio.plan.costs.levels import PREEMPTION_STEPS
from ckptio.plan.units import format_duration


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_plan_without_a_store_sizes_the_checkpoint_and_says_why_it_has_no_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _plan_json(capsys, "--preset", "mlperf-llama3-70b", "--step-time", "7", "--interval", "500")
    assert out["verdict"] == "unknown"
    assert out["reasons"] == ["no store given"] and out["reason_codes"] == ["no-store"]
    assert out["checkpoint_bytes"] == pytest.approx(911.2 * (1 << 30), rel=1e-3)  # MLPerf's 911.2 GiB
    assert out["ranks"] == 64 and out["objects_per_checkpoint"] > 64
    assert out["bytes_per_rank_max"] == pytest.approx(out["checkpoint_bytes"] / 64)  # type: ignore[operator]
    assert out["interval_s"] == pytest.approx(3500.0) and out["interval_steps"] == 500
    # The bandwidth a store would need for a flush to end before the next save: bytes ÷ interval.
    assert out["write_bytes_per_s_to_keep_up"] == pytest.approx(out["checkpoint_bytes"] / 3500.0)  # type: ignore[operator]
    for key in ("flush_s", "keeps_up", "modes"):  # what needs a store is there, and null
        assert key in out and out[key] is None
    assert out["restore_s"] == {"local": None, "partner": None, "durable": None}
    assert out["lost_gpu_hours_per_day_single"] is None and out["local_interval_s"] is None


def test_without_an_interval_an_async_plan_still_gets_daly_from_the_copy(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan_json(capsys, "--preset", "mlperf-llama3-8b")
    assert out["interval_source"] == "daly" and out["interval_s"] == out["optimal_interval_s"]
    sync = _plan_json(capsys, "--preset", "mlperf-llama3-8b", "--mode", "sync")
    assert sync["interval_s"] is None and sync["interval_source"] == "unknown"  # δ of a sync save is its flush


def test_the_human_plan_without_a_store_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--preset", "mlperf-llama3-70b"]) == 0
    out = capsys.readouterr().out
    assert "verdict: unknown" in out and "No store given" in out and "911.2 GiB" in out


def test_json_has_each_modes_cost_and_restore_per_level(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan_json(capsys, "--preset", "mlperf-llama3-8b", "--write-bandwidth", "20GB/s",
                     "--read-bandwidth", "40GB/s", "--cores-per-rank", "1")
    modes = out["modes"]
    assert isinstance(modes, dict) and sorted(modes) == sorted(MODES)
    for name, cost in modes.items():
        assert {"step_inflation", "lost_per_save_s", "blocking_s", "flush_s"} <= set(cost), name
        assert cost["lost_per_save_s"] >= cost["blocking_s"] >= 0
    assert modes["dcp_sync"]["step_inflation"] is None
    assert modes["ckptio"]["step_inflation"] > 1.0  # one core per rank: the writer shares training's core
    restore = out["restore_s"]
    assert isinstance(restore, dict) and set(restore) == {"local", "partner", "durable"}
    assert restore["local"] is None and restore["partner"] is None  # no --local-bandwidth: no local level
    # Eight ranks read 104.7 GiB at once at 40 GB/s.
    assert restore["durable"] == pytest.approx(out["checkpoint_bytes"] / 40e9, rel=1e-6)  # type: ignore[operator]
    assert out["verdict"] in ("ok", "warn", "fail")


def test_more_cores_per_rank_lower_the_async_cost_in_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--preset", "mlperf-llama3-8b", "--write-bandwidth", "20GB/s")
    tight = _plan_json(capsys, *args, "--cores-per-rank", "1")["modes"]
    roomy = _plan_json(capsys, *args, "--cores-per-rank", "16")["modes"]
    for name in ("dcp_async", "dcp_best", "ckptio"):
        assert roomy[name]["lost_per_save_s"] < tight[name]["lost_per_save_s"], name  # type: ignore[index]


@pytest.mark.parametrize("flag, value", [("--cores-per-rank", "0"), ("--cores-per-rank", "many"),
                                         ("--train-cores", "-1")])
def test_bad_host_flags_exit_2_with_the_flag_named(capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    assert main(["plan", "--preset", "mlperf-llama3-8b", flag, value]) == 2
    assert flag in capsys.readouterr().err


def test_plan_prints_the_grace_period_the_emergency_save_needs(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24: SIGTERM → ``maybe_save`` acts (the step under way and the vote's two calls) → the copy → the local
    level committed (own tier and partner copies). Only with a local level: one level has no emergency save."""
    args = ("--preset", "mlperf-llama3-8b", "--write-bandwidth", "20GB/s", "--step-time", "2")
    two = _plan_json(capsys, *args, "--local-bandwidth", "5GB/s")
    times = two["levels"]["times"]  # type: ignore[index]
    expected = PREEMPTION_STEPS * 2.0 + times["blocking_s"] + times["local_flush_s"]
    assert two["emergency_grace_s"] == pytest.approx(expected)
    slower = _plan_json(capsys, *args, "--local-bandwidth", "1GB/s")
    assert slower["emergency_grace_s"] > two["emergency_grace_s"]  # type: ignore[operator]
    assert _plan_json(capsys, *args)["emergency_grace_s"] is None
    assert _plan_json(capsys, "--preset", "mlperf-llama3-8b", "--local-bandwidth", "5GB/s")["emergency_grace_s"] is None
    assert main(["plan", *args, "--local-bandwidth", "5GB/s"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"emergency save needs a grace period of at least {format_duration(expected)}" in text
