"""``ckptio admit`` and ``ckptio plan`` end to end on this machine: exit codes, reasons, JSON keys."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptio._cli.main import main
from ckptio.errors import AdmissionError
from ckptio.plan.admit import AdmissionPolicy, admit
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import shape_checkpoint
from ckptio.plan.job.presets import PRESETS
from ckptio.plan.measure.profile import StorageProfile

PLAN_KEYS = {
    "checkpoint_bytes",
    "bytes_per_rank_max",
    "objects_per_checkpoint",
    "ranks",
    "blocking_s",
    "sync_stall_s",
    "flush_s",
    "keeps_up",
    "young_interval_s",
    "optimal_interval_s",
    "overhead_fraction",
    "verdict",
    "reasons",
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A $HOME of its own, so the machine's real home never decides a test."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


@pytest.fixture
def disk_profile(tmp_path: Path) -> Path:
    """A profile of a 300 MiB/s disk (the work disk of the 2-core development machine), as probe writes it."""
    path = tmp_path / "profile.json"
    StorageProfile(
        target=str(tmp_path),
        write_bytes_per_s=300 * 2**20,
        per_writer_bytes_per_s=200 * 2**20,
        read_bytes_per_s=600 * 2**20,
        metadata_ops_per_s=5000.0,
    ).save(path)
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    rc = main(argv)
    return rc, capsys.readouterr().out.splitlines()


def test_a_small_job_is_admitted(tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = _run(
        [
            "admit",
            "--params",
            "100M",
            "--ranks",
            "2",
            "--write-bandwidth",
            "300MiB/s",
            "--interval",
            "10m",
            "--root",
            str(tmp_path / "ckpt"),
        ],
        capsys,
    )
    assert rc == 0, lines
    assert lines[0].startswith("ckptio admit: ADMIT")
    assert not any(line.startswith("refuse:") for line in lines)


def test_a_small_job_is_admitted_on_a_live_probe(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    rc, lines = _run(
        [
            "admit",
            "--params",
            "50M",
            "--ranks",
            "2",
            "--interval",
            "10m",
            "--probe",
            "--probe-seconds",
            "8",
            "--root",
            str(root),
            "--json",
        ],
        capsys,
    )
    decision = json.loads("\n".join(lines))
    assert rc == 0, decision["reasons"]
    assert decision["admitted"] and decision["reasons"] == []
    assert decision["free_bytes"] > 0
    assert not root.exists()  # the probe cleaned up after itself


def test_405b_every_5_minutes_on_this_disk_is_refused_with_reasons(
    tmp_path: Path, home: Path, disk_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines = _run(
        [
            "admit",
            "--preset",
            "mlperf-llama3-405b",
            "--profile",
            str(disk_profile),
            "--interval",
            "5m",
            "--root",
            str(tmp_path / "ckpt"),
        ],
        capsys,
    )
    assert rc == 1
    assert lines[0].startswith("ckptio admit: REFUSE")
    refusals = [line for line in lines if line.startswith("refuse:")]
    assert any("flush cannot finish within the interval" in line for line in refusals)
    assert any("free space below keep_last + 1 checkpoints" in line for line in refusals)


def test_root_under_home_is_refused(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = _run(
        [
            "admit",
            "--params",
            "100M",
            "--write-bandwidth",
            "1GB/s",
            "--interval",
            "10m",
            "--root",
            str(home / "ckpt"),
        ],
        capsys,
    )
    assert rc == 1
    assert any(line.startswith("refuse: root under $HOME") for line in lines)


def test_dataset_volume_is_refused_only_for_large_gangs(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    common = [
        "admit",
        "--params",
        "10M",  # small: the free-space rule must not decide this test on a nearly full disk
        "--write-bandwidth",
        "100GB/s",
        "--interval",
        "1h",
        "--root",
        str(tmp_path / "ckpt"),
        "--data-dir",
        str(data),
        "--split-volumes-above",
        "64",
    ]
    rc, lines = _run([*common, "--ranks", "128"], capsys)
    assert rc == 1
    assert any("checkpoints on the dataset volume for a gang of 128 ranks" in line for line in lines)
    rc, lines = _run([*common, "--ranks", "8"], capsys)
    assert rc == 0
    assert any(line.startswith("warn:") and "share one volume" in line for line in lines)


def test_put_rate_and_stall_budget_refusals(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = _run(
        [
            "admit",
            "--preset",
            "mlperf-llama3-405b",
            "--storage-kind",
            "object",
            "--write-bandwidth",
            "2TB/s",
            "--interval",
            "1h",
        ],
        capsys,
    )
    assert rc == 1
    assert any(line.startswith("refuse: PUT rate over the per-prefix limit") for line in lines)
    rc, lines = _run(
        [
            "admit",
            "--params",
            "1B",
            "--ranks",
            "8",
            "--write-bandwidth",
            "1GB/s",
            "--mode",
            "sync",
            "--interval",
            "10m",
            "--max-stall",
            "5s",
        ],
        capsys,
    )
    assert rc == 1
    assert any(line.startswith("refuse: synchronous stall") for line in lines)


@pytest.mark.parametrize(
    "argv",
    [
        ["admit", "--params", "1B"],  # no store
        ["admit", "--params", "1B", "--write-bandwidth", "fast"],
        ["admit", "--params", "1B", "--write-bandwidth", "1GB/s", "--probe"],  # --probe without --root
        ["admit", "--params", "1B", "--preset", "mlperf-llama3-8b", "--write-bandwidth", "1GB/s"],
        ["admit", "--params", "1B", "--write-bandwidth", "1GB/s", "--interval", "500"],  # steps, no step time
        ["admit", "--params", "1B", "--write-bandwidth", "1GB/s", "--ranks", "6", "--tp", "4"],
        ["admit", "--hidden", "64", "--write-bandwidth", "1GB/s"],  # half an architecture
        ["admit", "--params", "1B", "--write-bandwidth", "1GB/s", "--profile", "/nonexistent.json"],
        ["admit", "--params", "1B", "--write-bandwidth", "1GB/s", "--data-dir", "/tmp"],  # no --root
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("ckptio admit:")


def test_argparse_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["admit", "--preset", "no-such-model", "--write-bandwidth", "1GB/s"])
    assert info.value.code == 2


def test_library_gate_raises_admission_error(tmp_path: Path) -> None:
    shape = shape_checkpoint(PRESETS["mlperf-llama3-405b"].spec())
    budget = plan_burst(shape, StoreLimits(write_bytes_per_s=300 * 2**20), Schedule(interval_s=300))
    decision = admit(budget, root=str(tmp_path), policy=AdmissionPolicy(keep_last=1), home=str(tmp_path / "h"))
    assert not decision.admitted
    assert decision.needed_bytes == pytest.approx(2 * shape.total_bytes)
    with pytest.raises(AdmissionError) as info:
        decision.raise_if_refused()
    assert info.value.root == str(tmp_path)


def test_plan_json_has_the_contract_keys(disk_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = _run(
        [
            "plan",
            "--preset",
            "mlperf-llama3-8b",
            "--profile",
            str(disk_profile),
            "--interval",
            "1h",
            "--json",
        ],
        capsys,
    )
    assert rc == 0
    budget = json.loads("\n".join(lines))
    assert set(budget) >= PLAN_KEYS
    assert budget["checkpoint_bytes"] / 2**30 == pytest.approx(104.7, rel=0.005)
    assert budget["ranks"] == 8
    assert budget["flush_s"] > 0 and isinstance(budget["keeps_up"], bool)


def test_plan_human_output_has_a_table_and_a_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = _run(
        [
            "plan",
            "--layers",
            "32",
            "--hidden",
            "4096",
            "--ffn",
            "14336",
            "--heads",
            "32",
            "--kv-heads",
            "8",
            "--vocab",
            "128256",
            "--ranks",
            "8",
            "--zero",
            "3",
            "--write-bandwidth",
            "300MiB/s",
            "--step-time",
            "2",
            "--interval",
            "150",
        ],
        capsys,
    )
    text = "\n".join(lines)
    assert rc == 0
    assert "104.7 GiB" in text and "flush" in text and "Young / Daly" in text
    assert "verdict: fail" in text and "write bandwidth" in text


def test_plan_with_preset_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = _run(
        ["plan", "--preset", "mlperf-llama3-70b", "--ranks", "128", "--write-bandwidth", "20GB/s", "--json"],
        capsys,
    )
    budget = json.loads("\n".join(lines))
    assert rc == 0
    assert budget["ranks"] == 128  # TP 8 kept from the preset, DP 16 from --ranks
    assert budget["interval_source"] == "daly"


def test_posix_root_needs_a_region_label_for_an_allowed_region_rule(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "admit",
        "--params",
        "100M",
        "--write-bandwidth",
        "1GB/s",
        "--interval",
        "10m",
        "--root",
        str(tmp_path / "ckpt"),
        "--allowed-region",
        "eu-west-1",
    ]
    rc, lines = _run(common, capsys)
    assert rc == 1
    assert any(line.startswith("refuse: residency:") and "no region label" in line for line in lines)
    rc, lines = _run([*common, "--root-region", "eu-west-1"], capsys)
    assert rc == 0, lines
    rc, lines = _run([*common, "--root-region", "us-east-1"], capsys)
    assert rc == 1


@pytest.mark.s3
def test_s3_roots_are_checked_for_residency(
    make_bucket: Callable[..., str], home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "admit",
        "--params",
        "100M",
        "--storage-kind",
        "object",
        "--write-bandwidth",
        "1GB/s",
        "--interval",
        "10m",
    ]
    private = make_bucket()
    rc, lines = _run([*common, "--root", f"s3://{private}/run1"], capsys)
    assert rc == 0, lines
    public = make_bucket(public="policy")
    rc, lines = _run([*common, "--root", f"s3://{public}/run1"], capsys)
    assert rc == 1
    assert any(line.startswith("refuse: residency:") and "public" in line for line in lines)
    rc, lines = _run([*common, "--root", f"s3://{public}/run1", "--allow-public"], capsys)
    assert rc == 0, lines
    far = make_bucket("eu-west-1")
    rc, lines = _run([*common, "--root", f"s3://{far}/run1", "--allowed-region", "us-east-1"], capsys)
    assert rc == 1
    assert any("outside allowed_regions" in line for line in lines)
