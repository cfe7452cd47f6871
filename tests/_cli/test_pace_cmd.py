"""``plan``, ``admit`` and ``simulate`` speak in bursts and paces; the GPU plan stages as the engine does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckptio._cli.main import main

JOB = ["--preset", "mlperf-llama3-8b", "--write-bandwidth", "10GB/s", "--interval", "30m"]
"""8 ranks, 104.7 GiB a save, every 30 minutes, on a 10 GB/s store: a flush of 11.2 s."""
GB = 1e9


def _json(capsys: pytest.CaptureFixture[str], *argv: str, rc: int = 0) -> dict[str, Any]:
    assert main([*argv, "--json"]) == rc
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _lines(capsys: pytest.CaptureFixture[str], *argv: str, rc: int) -> list[str]:
    assert main(list(argv)) == rc
    return capsys.readouterr().out.splitlines()


def test_plan_json_gives_the_burst_the_paced_demand_and_both_lags(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "plan", *JOB)
    assert out["flush_pace"] is None and out["flush_pace_fraction"] == 0.5
    assert out["peak_demand_bytes_per_s"] == pytest.approx(10 * GB)  # eight writers fill the store
    # Not paced: the paced figures are auto's, the job's bytes over half the interval.
    assert out["paced_demand_bytes_per_s"] == pytest.approx(out["checkpoint_bytes"] / 900.0)
    assert out["unpaced_lag_s"] == pytest.approx(out["flush_s"]) and out["paced_lag_s"] == pytest.approx(900.0)
    assert out["paced_expected_lost_work_s"] == pytest.approx(out["expected_lost_work_s"] - out["flush_s"] + 900.0)
    assert out["store_share"] is None and out["recommended_flush_pace"] is None
    node = _json(capsys, "plan", *JOB, "--flush-pace", "2GB/s", "--ranks-per-node", "4")
    assert node["flush_pace"] == 2e9 and node["paced_demand_bytes_per_s"] == pytest.approx(4e9)  # two nodes
    assert node["paced_lag_s"] == pytest.approx(node["bytes_per_rank_max"] / 0.5e9)


def test_plan_recommends_auto_when_the_burst_exceeds_the_share_and_the_paced_demand_does_not(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "plan", *JOB, "--store-share", "0.25")
    assert out["recommended_flush_pace"] == "auto" and out["store_share_bytes_per_s"] == pytest.approx(2.5 * GB)
    lines = _lines(capsys, "plan", *JOB, "--store-share", "0.25", rc=0)
    assert any(line.startswith('recommend: flush_pace="auto"') for line in lines), lines
    assert _json(capsys, "plan", *JOB, "--store-share", "0.25", "--flush-pace", "auto")["recommended_flush_pace"] \
        is None  # already paced
    assert _json(capsys, "plan", *JOB, "--store-share", "1")["recommended_flush_pace"] is None  # the whole store
    assert not any("recommend:" in line for line in _lines(capsys, "plan", *JOB, rc=0))


def test_a_plan_without_a_store_has_the_pace_keys_null(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "plan", "--preset", "mlperf-llama3-8b", "--flush-pace", "auto")
    assert out["flush_pace"] == "auto"
    for key in ("peak_demand_bytes_per_s", "paced_demand_bytes_per_s", "paced_lag_s", "paced_expected_lost_work_s",
                "recommended_flush_pace"):
        assert key in out and out[key] is None, key


def test_the_gpu_plan_stages_ckptio_beside_the_next_step_as_dcp_best(capsys: pytest.CaptureFixture[str]) -> None:
    """``save()`` enqueues the copy on a side CUDA stream; the guard makes only the optimizer step wait for it."""
    modes = _json(capsys, "plan", *JOB, "--step-time", "5s")["modes"]
    for name in ("ckptio", "dcp_best"):  # the 0.70 s copy hides behind 4.5 s of forward and backward
        assert modes[name]["blocking_s"] == 0.0 and modes[name]["staging_wait_s"] == 0.0, name
    assert modes["ckptio"]["lost_per_save_s"] <= modes["dcp_best"]["lost_per_save_s"]
    assert modes["dcp_async"]["blocking_s"] >= 0.70  # default async_save still blocks for its copy
    short = _json(capsys, "plan", *JOB, "--step-time", "0.5s")
    copy = short["blocking_s"]
    for name in ("ckptio", "dcp_best"):  # a 0.45 s forward and backward leave the rest of the copy to wait for
        assert short["modes"][name]["staging_wait_s"] == pytest.approx(copy - 0.45), name
        assert short["modes"][name]["lost_per_save_s"] >= copy - 0.45
    unknown = _json(capsys, "plan", *JOB)["modes"]  # no step time: the whole copy is charged, to both alike
    assert unknown["ckptio"]["staging_wait_s"] == unknown["dcp_best"]["staging_wait_s"] == pytest.approx(copy)


def test_admit_refuses_a_burst_above_the_share_and_says_pacing_would_admit_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lines(capsys, "admit", *JOB, "--store-share", "0.25", rc=1)
    reason = next(line for line in lines if line.startswith("refuse: store share"))
    assert "burst of 10.0 GB/s" in reason and "2.5 GB/s" in reason  # the burst against the share
    assert 'flush_pace="auto" would spread it to 124.9 MB/s' in reason and "--flush-pace auto" in reason
    # Without a share the rule is off.
    assert _lines(capsys, "admit", *JOB, rc=0)[0].startswith("ckptio admit: ADMIT")


def test_admit_admits_a_paced_job_whose_burst_alone_would_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lines(capsys, "admit", *JOB, "--store-share", "0.25", "--flush-pace", "auto", rc=0)
    assert lines[0].startswith("ckptio admit: ADMIT")
    note = next(line for line in lines if line.startswith("note: store share"))
    assert "burst of 10.0 GB/s" in note and "2.5 GB/s" in note and "paced demand of 124.9 MB/s" in note
    out = _json(capsys, "admit", *JOB, "--store-share", "0.25", "--flush-pace", "auto")
    pace = out["pace"]
    assert out["admitted"] and pace["paced_demand_bytes_per_s"] < 2.5 * GB < pace["peak_demand_bytes_per_s"]
    # A node budget whose paced demand is still above the share is refused, naming both figures.
    lines = _lines(capsys, "admit", *JOB, "--store-share", "0.25", "--flush-pace", "8GB/s", rc=1)
    reason = next(line for line in lines if line.startswith("refuse: store share"))
    assert "paced demand of 8.0 GB/s" in reason and "2.5 GB/s" in reason and "burst of 10.0 GB/s" in reason


def test_simulate_paces_its_writers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", *JOB, "--checkpoints", "3"]
    unpaced = _json(capsys, *argv)
    paced = _json(capsys, *argv, "--flush-pace", "auto", "--flush-pace-fraction", "0.25")
    assert unpaced["peak_store_demand_bytes_per_s"] == pytest.approx(10 * GB)
    assert paced["peak_store_demand_bytes_per_s"] == pytest.approx(unpaced["flush_s"] * 10 * GB / 450.0, rel=1e-3)
    assert paced["flush_s"] == pytest.approx(450.0, rel=1e-3)


@pytest.mark.parametrize(("command", "flag", "value"), [
    ("plan", "--flush-pace", "0"), ("plan", "--flush-pace", "nan"), ("plan", "--flush-pace", "1e-320"),
    ("plan", "--flush-pace", "slow"), ("plan", "--flush-pace-fraction", "0"),
    ("plan", "--flush-pace-fraction", "1.5"), ("plan", "--flush-pace-fraction", "1e-320"),
    ("plan", "--store-share", "0"), ("plan", "--store-share", "2"), ("plan", "--store-share", "half"),
    ("admit", "--store-share", "1e-320"), ("admit", "--ranks-per-node", "0"), ("admit", "--flush-pace", "1e308"),
    ("simulate", "--flush-pace", "-1GB/s"), ("simulate", "--flush-pace-fraction", "nan"),
])
def test_a_pace_flag_out_of_bounds_exits_2_naming_it(capsys: pytest.CaptureFixture[str], command: str, flag: str,
                                                     value: str) -> None:
    assert main([command, *JOB, f"{flag}={value}"]) == 2
    assert flag in capsys.readouterr().err
