"""``ckptio ls`` and ``ckptio verify`` agree on what is committed at each level of a two-level root.

The roots are written by a real Checkpointer with two levels (one rank, one node, no partners): its first save of
each run is a local-level step (records under ``levels/local/`` on the root, data in the node's ``local_dir``), the
second also durable. ``verify`` checks a local-level step by its records and says that its data, on node-local
disks, was not read; ``ls`` names the levels each step is committed on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import ckptio
from ckptio._cli.main import main as cli
from ckptio.format import index_key, manifest_key, step_dir
from ckptio.format.local_level_records import LEVELS_LOCAL


def _local(root: Path, key: str) -> Path:
    """A key of the local level's records (they lie under ``levels/local/`` of the root)."""
    return root / LEVELS_LOCAL / key


pytestmark = pytest.mark.slow  # two Checkpointer runs (two writer processes booting torch) build the roots


def _state(step: int) -> dict:
    return {"w": torch.full((64, 64), float(step)), "lr": 0.1}


@pytest.fixture(scope="module")
def level_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``both``: step 2 committed on the durable and the local level. ``split``: step 2 durable only (its local copy
    evicted by a newer local step), step 3 local only."""
    base = tmp_path_factory.mktemp("levels")
    root = base / "root"
    options = {"local_dir": str(base / "local"), "node_id": "n0", "durable_every": 2, "replicas": 0, "keep_last": 0,
               "fsync": False, "lease_s": 0, "volume_check": "off"}
    with ckptio.Checkpointer(str(root), **options) as ck:
        for step in (1, 2):
            ck.save(step, _state(step)).wait(timeout=120)
    shutil.copytree(root, base / "both")
    with ckptio.Checkpointer(str(root), **options) as ck:  # its first save: local level only
        ck.save(3, _state(3)).wait(timeout=120)
    return {"both": base / "both", "split": root}


@pytest.fixture
def split_root(level_roots: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the ``split`` root, to tamper with."""
    shutil.copytree(level_roots["split"], tmp_path / "root")
    return tmp_path / "root"


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = cli([*args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _committed_per_level(capsys: pytest.CaptureFixture[str], root: Path) -> tuple[set, set]:
    """(what ls lists as committed, what verify checked): sets of (step, level)."""
    assert cli(["ls", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["steps"]
    _, report = _json(capsys, "verify", str(root))
    listed = {(r["step"], level) for r in rows for level in r["levels"]}
    verified = {(s["step"], s["level"]) for s in report["steps"]}
    return listed, verified


@pytest.mark.parametrize(("name", "expected"), [
    ("split", {(2, "durable"), (3, "local")}),
    ("both", {(2, "durable"), (2, "local")}),
])
def test_ls_and_verify_agree_on_every_level(level_roots, capsys, name, expected):
    listed, verified = _committed_per_level(capsys, level_roots[name])
    assert listed == verified == expected


def test_verify_checks_a_local_level_step_and_says_its_data_was_not_read(level_roots, capsys):
    root = str(level_roots["split"])
    rc, report = _json(capsys, "verify", root, "--step", "3", "--strict")
    assert rc == 0 and report["ok"] is True
    (result,) = report["steps"]
    assert (result["level"], result["problems"], result["warnings"], result["files"]) == ("local", [], [], 1)
    assert any("node-local disks (n0)" in n and "not read" in n for n in result["notes"]), result
    assert cli(["verify", root, "--step", "3"]) == 0
    out = capsys.readouterr().out
    assert "step 3 (local level): ok, records only" in out and "note: data not read" in out


def test_ls_names_the_levels_of_each_step(level_roots, capsys):
    capsys.readouterr()
    assert cli(["ls", str(level_roots["split"])]) == 0
    lines = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line[:1] in "│|"}
    assert "durable (latest)" in lines["2"] and "node n0" not in lines["2"]
    assert "local" in lines["3"] and "durable" not in lines["3"] and "node n0" in lines["3"]


def test_a_step_on_no_level_is_still_not_committed(level_roots, capsys):
    rc, report = _json(capsys, "verify", str(level_roots["split"]), "--step", "1")
    assert rc == 1 and report["steps"][0]["level"] == "durable"
    assert "no committed checkpoint" in report["steps"][0]["problems"][0]


def _damage_metadata(root: Path) -> None:
    path = _local(root, f"{step_dir(3)}/.metadata")
    path.write_bytes(path.read_bytes()[:-8] + b"\0" * 8)


def _move_holders(root: Path) -> None:
    path = _local(root, index_key(3, 0))
    entry = json.loads(path.read_text())
    for file in entry["files"]:
        file["holders"] = ["elsewhere"]
    path.write_text(json.dumps(entry))


def _stray_record(root: Path) -> None:
    _local(root, f"{step_dir(3)}/__0_0-stray.distcp").write_bytes(b"not a record")


def _drop_index(root: Path) -> None:
    _local(root, index_key(3, 0)).unlink()


@pytest.mark.parametrize(("tamper", "problem", "warning"), [
    (_damage_metadata, "levels/local/step-00000003/.metadata: checksum", None),
    (_move_holders, None, "ranks/0.json: holders ['elsewhere'] of __0_0-"),
    (_stray_record, None, "__0_0-stray.distcp: orphaned (not a record of the local level)"),
    (_drop_index, None, "ranks/0.json: missing or unreadable"),
], ids=["metadata", "holders", "stray", "index"])
def test_verify_finds_damage_in_local_level_records(split_root, capsys, tamper, problem, warning):
    tamper(split_root)
    rc, report = _json(capsys, "verify", str(split_root), "--step", "3", "--strict")
    (result,) = report["steps"]
    assert rc == 1 and result["level"] == "local"
    if problem:
        assert any(p.startswith(problem) for p in result["problems"]), result
    else:
        assert result["problems"] == [] and any(warning in w for w in result["warnings"]), result
        assert cli(["verify", str(split_root), "--step", "3"]) == 0  # a warning fails --strict only


def test_a_corrupt_local_manifest_is_committed_and_fails_verify(split_root, capsys):
    _local(split_root, manifest_key(3)).write_text("{not json")
    assert cli(["ls", str(split_root), "--json"]) == 0
    row = {r["step"]: r for r in json.loads(capsys.readouterr().out)["steps"]}[3]
    assert row["committed"] is True and row["levels"] == ["local"] and row["corrupt"].startswith("local level: ")
    rc, report = _json(capsys, "verify", str(split_root))
    assert rc == 1
    assert [(s["step"], s["level"], s["ok"]) for s in report["steps"]] == [(2, "durable", True), (3, "local", False)]
