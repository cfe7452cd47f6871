"""The probe against real directories (and stores): figures present, time bound kept, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptio._cli.main import main
from ckptio.errors import ConfigError
from ckptio.plan.measure.probe import ProbeConfig, probe, target_capabilities
from ckptio.plan.measure.profile import StorageProfile
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import ThrottledStorage

MIB = 1 << 20


def _small(max_seconds: float = 20.0, **overrides: object) -> ProbeConfig:
    fields: dict[str, object] = {
        "writers": 2,
        "file_size_bytes": 8 * MIB,
        "files_per_writer": 2,
        "small_files": 64,
        "max_seconds": max_seconds,
    }
    fields.update(overrides)
    return ProbeConfig(**fields)  # type: ignore[arg-type]


def test_probe_of_a_directory_measures_everything_and_leaves_nothing(tmp_path: Path) -> None:
    phases: list[str] = []
    profile = probe(tmp_path, _small(), progress=lambda phase, _: phases.append(phase))
    assert profile.write_bytes_per_s > 0
    assert profile.per_writer_bytes_per_s > 0
    assert profile.read_bytes_per_s > 0
    assert profile.metadata_ops_per_s > 0
    # Every kind a commit makes, each measured alone (fsync: a 4 KiB rewrite made durable).
    assert set(profile.metadata) == {"create", "stat", "rename", "list", "fsync", "unlink"}
    assert all(rate > 0 for rate in profile.metadata.values())
    assert profile.to_json()["metadata"] == profile.metadata
    kinds = [v for k, v in profile.metadata.items() if k != "fsync"]
    assert profile.metadata_ops_per_s == pytest.approx(len(kinds) / sum(1 / v for v in kinds))
    assert profile.fsync_s is not None and profile.fsync_s >= 0
    assert profile.serialize_bytes_per_s is not None and profile.serialize_bytes_per_s > 0
    assert [p.writers for p in profile.concurrency] == [1, 2]
    assert profile.fs_type is not None and profile.kind == "posix"
    assert phases[-1] == "done" and any(p.startswith("write") for p in phases)
    assert os.listdir(tmp_path) == []


def test_probe_creates_a_missing_target_and_removes_it_again(tmp_path: Path) -> None:
    probe(tmp_path / "a" / "b", _small())
    assert os.listdir(tmp_path) == []


def test_time_bound_is_honoured(tmp_path: Path) -> None:
    # Unbounded, this would write 2 × 16 × 64 MiB per level; the bound cuts it short.
    config = _small(max_seconds=3.0, file_size_bytes=64 * MIB, files_per_writer=16)
    start = time.monotonic()
    profile = probe(tmp_path, config)
    elapsed = time.monotonic() - start
    assert profile.truncated
    # Slack for one chunk per writer, the last fsync and the clean-up; the unbounded run takes far longer.
    assert elapsed < config.max_seconds + 5.0
    assert profile.write_bytes_per_s > 0
    assert os.listdir(tmp_path) == []


def test_probe_through_the_storage_protocol_never_overstates_a_throttle(tmp_path: Path) -> None:
    cap = 64 * MIB
    (tmp_path / "throttle").touch()
    store = ThrottledStorage(
        PosixStorage(tmp_path / "store", fsync=False),
        write_bytes_per_s=cap,
        state_path=str(tmp_path / "throttle"),
    )
    profile = probe(store, _small(file_size_bytes=4 * MIB))
    assert profile.fsync_s is None
    assert set(profile.metadata) == {"create", "stat", "list", "unlink"}, "a store has no rename or fsync"
    assert 0 < profile.write_bytes_per_s <= cap * 1.1
    assert list(store.list("")) == []


def test_profile_round_trips_and_bad_profiles_are_config_errors(tmp_path: Path) -> None:
    profile = probe(tmp_path / "t", _small())
    path = tmp_path / "profile.json"
    profile.save(path)
    again = StorageProfile.load(path)
    assert again == profile
    path.write_text(json.dumps({"target": "x"}))
    with pytest.raises(ConfigError, match=str(path)):
        StorageProfile.load(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        StorageProfile.load(path)
    with pytest.raises(ConfigError, match="cannot read"):
        StorageProfile.load(tmp_path / "missing.json")


def test_probe_needs_free_space_for_its_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="free"):
        probe(tmp_path, _small(file_size_bytes=1 << 50))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"writers": 0}, {"file_size_bytes": 1}, {"max_seconds": 0}, {"files_per_writer": 0}, {"small_files": 0}],
)
def test_bad_probe_configs(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ProbeConfig(**kwargs)  # type: ignore[arg-type]


def test_levels_double_up_to_the_writers() -> None:
    assert ProbeConfig(writers=1).levels() == [1]
    assert ProbeConfig(writers=6).levels() == [1, 2, 4, 6]
    assert ProbeConfig(writers=8).levels() == [1, 2, 4, 8]


def test_cli_json_and_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.json"
    target = tmp_path / "target"
    rc = main(
        [
            "probe",
            str(target),
            "--writers",
            "2",
            "--file-size",
            "4MiB",
            "--small-files",
            "32",
            "--max-seconds",
            "20",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    for key in ("write_bytes_per_s", "read_bytes_per_s", "metadata_ops_per_s"):
        assert printed[key] > 0
    assert StorageProfile.load(out).write_bytes_per_s == printed["write_bytes_per_s"]
    assert not target.exists()


def test_cli_bad_arguments_exit_2(tmp_path: Path) -> None:
    assert main(["probe", str(tmp_path), "--file-size", "lots"]) == 2
    assert main(["probe", str(tmp_path), "--max-seconds", "-1"]) == 2


@pytest.mark.s3
def test_probe_of_an_s3_prefix_cleans_the_bucket(s3_bucket: str, s3_client: object) -> None:
    profile = probe(f"s3://{s3_bucket}/probe", _small(file_size_bytes=2 * MIB, small_files=16))
    assert profile.kind == "object"
    assert profile.write_bytes_per_s > 0 and profile.metadata_ops_per_s > 0
    listing = s3_client.list_objects_v2(Bucket=s3_bucket)  # type: ignore[attr-defined]
    assert listing.get("KeyCount", 0) == 0


_INTERRUPTED_PROBE = """
import sys
from ckptio._cli.main import main
sys.exit(main(["probe", sys.argv[1], "--writers", "2", "--file-size", "256MiB", "--files-per-writer", "8",
               "--max-seconds", "120"]))
"""


def _wait_for_data_writes(parent: Path, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Until the probe is writing its first data files (``<probe dir>/w1/``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(parent.glob(".ckptio-probe-*/w1/*")):
            return
        if proc.poll() is not None:
            raise AssertionError(f"probe exited early: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("the probe never started writing")


def test_an_interrupted_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) and SIGTERM (a scheduler) mid-write: both processes exit and remove every file."""
    targets = {signal.SIGINT: tmp_path / "int" / "target", signal.SIGTERM: tmp_path / "term" / "target"}
    procs = {}
    for sig, target in targets.items():
        target.parent.mkdir()
        procs[sig] = subprocess.Popen(
            [sys.executable, "-c", _INTERRUPTED_PROBE, str(target)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    for sig, proc in procs.items():
        _wait_for_data_writes(targets[sig], proc)
        time.sleep(0.3)  # mid-write
        proc.send_signal(sig)
    for sig, proc in procs.items():
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err.decode()
        assert b"interrupted" in err
        assert os.listdir(targets[sig].parent) == [], f"{sig!r} left {os.listdir(targets[sig].parent)}"


def test_directory_capabilities_are_tried_and_leave_the_root_as_found(tmp_path: Path) -> None:
    root = tmp_path / "new" / "root"
    caps = target_capabilities(str(root))
    assert caps.conditional_writes and caps.url == root.as_uri()
    assert "link()" in caps.get("conditional_create").detail or "O_EXCL" in caps.get("conditional_create").detail
    assert not (tmp_path / "new").exists(), "the parents the check had to create are removed"
    (tmp_path / "kept").mkdir()
    target_capabilities(tmp_path / "kept")
    assert list((tmp_path / "kept").iterdir()) == []


def test_probe_reports_how_a_directory_excludes_other_clients(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    args = ["probe", str(tmp_path), "--writers", "1", "--file-size", "64KiB", "--files-per-writer", "1",
            "--small-files", "8", "--max-seconds", "5", "--no-fsync", "--json"]
    assert main(args) == 0
    caps = json.loads(capsys.readouterr().out)["capabilities"]
    assert caps["conditional_create"]["ok"] is True and "link()" in caps["conditional_create"]["detail"]
    assert caps["compare_and_swap"]["ok"] is True and "O_EXCL lock file" in caps["compare_and_swap"]["detail"]
    assert list(tmp_path.iterdir()) == []


def test_without_fsync_the_probe_measures_no_fsync_rate(tmp_path: Path) -> None:
    profile = probe(tmp_path, _small(fsync=False, max_seconds=5.0))
    assert "fsync" not in profile.metadata and {"create", "unlink"} <= set(profile.metadata)
