"""``ckptio plan`` and ``ckptio admit`` count the metadata of a save and its commit, and refuse a job whose commits
cannot keep up with its saves on the probed store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptio._cli.main import main
from ckptio.format.commit_ops import CommitShape, commit_ops
from ckptio.plan.measure.profile import StorageProfile

KINDS = ("create", "stat", "rename", "list", "fsync", "unlink")
EXT4 = {"create": 2914.0, "stat": 26968.0, "rename": 22435.0, "list": 9368.0, "fsync": 2402.0, "unlink": 3859.0}
"""Rates the probe measured on a local ext4 disk (docs/planning.md)."""
# A small job: 100M parameters (1.6 GB) over two ranks, each writing its data in one file.
JOB = ["--params", "100M", "--ranks", "2", "--file-size", "4GiB", "--interval", "1min"]


def _profile(tmp_path: Path, rates: dict[str, float]) -> str:
    path = tmp_path / "profile.json"
    StorageProfile(target=str(tmp_path), write_bytes_per_s=300 * 2**20, per_writer_bytes_per_s=200 * 2**20,
                   read_bytes_per_s=600 * 2**20, metadata_ops_per_s=5000.0, metadata=rates).save(path)
    return str(path)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_plan_json_gives_the_engines_operations_and_their_time(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _json(capsys, "plan", *JOB, "--profile", _profile(tmp_path, EXT4), "--keep-last", "2")
    assert rc == 0 and out["verdict"] == "ok"
    expected = commit_ops(CommitShape(world_size=2, files_per_rank=1, keep_last=2))
    assert out["metadata_ops"] == {"per_save": expected.per_save, "per_commit": expected.per_commit}
    assert 0 < out["commit_metadata_s"] < 1  # type: ignore[operator]
    assert out["commit_metadata"]["rates_source"] == "probed"  # type: ignore[index]


def test_plan_without_a_store_still_counts_the_operations(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _json(capsys, "plan", *JOB)
    assert rc == 0 and out["verdict"] == "unknown"
    assert out["metadata_ops"]["per_commit"] == commit_ops(  # type: ignore[index]
        CommitShape(world_size=2, files_per_rank=1, keep_last=3)).per_commit
    assert out["commit_metadata_s"] is None


def test_admit_refuses_a_store_whose_metadata_cannot_keep_up(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    slow = _profile(tmp_path, dict.fromkeys(KINDS, 1.0))
    rc, out = _json(capsys, "admit", *JOB, "--profile", slow)
    assert rc == 1 and not out["admitted"]
    assert any("metadata" in reason for reason in out["reasons"])  # type: ignore[attr-defined]
    assert out["plan"]["keeps_up"]  # type: ignore[index]  # the bytes keep up; the metadata does not
    rc, out = _json(capsys, "admit", *JOB, "--profile", _profile(tmp_path, EXT4))
    assert rc == 0 and out["admitted"], out["reasons"]


def test_the_human_plan_prints_one_metadata_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *JOB, "--profile", _profile(tmp_path, dict.fromkeys(KINDS, 1.0))]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("commit metadata")]) == 1
    words = " ".join(out.split())  # rich wraps the paragraph at the terminal's width
    assert "verdict: fail" in words and "Metadata operations of a save and its commit take" in words


def test_the_commands_as_a_user_runs_them(tmp_path: Path) -> None:
    slow, env = _profile(tmp_path, dict.fromkeys(KINDS, 1.0)), {**os.environ, "COLUMNS": "200"}
    command = [sys.executable, "-m", "ckptio._cli.main"]
    plan = subprocess.run([*command, "plan", *JOB, "--profile", slow, "--json"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["reason_codes"][0] == "metadata"
    refused = subprocess.run([*command, "admit", *JOB, "--profile", slow], capture_output=True, text=True, env=env,
                             timeout=120, check=False)
    assert refused.returncode == 1, refused.stderr
    assert refused.stdout.startswith("ckptio admit: REFUSE") and "refuse: metadata" in refused.stdout


@pytest.mark.parametrize("value", ["abc", "-1", "99999999"])
def test_a_bad_keep_last_exits_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *JOB, "--write-bandwidth", "1GB/s", "--keep-last", value]) == 2
    assert capsys.readouterr().err.startswith("ckptio plan: --keep-last")


def test_the_lag_to_a_commit_is_the_flush_then_the_commits_operations(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _json(capsys, "plan", *JOB, "--profile", _profile(tmp_path, EXT4))
    commit_s = out["commit_metadata"]["commit_s"]  # type: ignore[index]
    assert rc == 0 and commit_s > 0
    assert out["commit_lag_s"] == pytest.approx(out["flush_s"] + commit_s)  # type: ignore[operator]
