"""``ckptio verify`` cross-checks the manifest, ``.metadata`` and the rank indexes, reports orphaned files and stale
indexes (warnings; ``--strict`` fails on them), and never runs code from the store. Real checkpoints, tampered."""

from __future__ import annotations

import json
import os
import pickle

from torch.distributed.checkpoint.metadata import MetadataIndex

from ckptio._cli.main import main as cli
from tests.format.tamper import MakeDirPayload, load_manifest, load_metadata, step_path, write_metadata


def _verify_json(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = cli(["verify", *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_swapped_storage_data_with_a_blanked_checksum_fails(ckpt_root, capsys):
    """Repro: a blanked ``metadata_crc32c`` plus swapped storage data restored lr='x', name=0.1, verify exit 0."""
    md = load_metadata(ckpt_root, 2)
    lr, name = MetadataIndex("lr"), MetadataIndex("name")
    md.storage_data[lr], md.storage_data[name] = md.storage_data[name], md.storage_data[lr]
    write_metadata(ckpt_root, 2, pickle.dumps(md), crc="")
    rc, report = _verify_json(capsys, ckpt_root, "--step", "2")
    assert rc == 1 and report["ok"] is False
    (step,) = report["steps"]
    assert any("'lr'" in p and "rank 0 wrote it" in p for p in step["problems"]), step
    assert any("no checksum" in w for w in step["warnings"])


def test_items_outside_listed_files_or_past_their_end_fail(ckpt_root, capsys):
    md = load_metadata(ckpt_root, 2)
    md.storage_data[MetadataIndex("lr")].length = 1 << 40
    md.storage_data[MetadataIndex("name")].relative_path = "../step-00000001/elsewhere.distcp"
    write_metadata(ckpt_root, 2, pickle.dumps(md))  # checksum fixed: only the cross-check can tell
    rc, report = _verify_json(capsys, ckpt_root, "--step", "2")
    problems = report["steps"][0]["problems"]
    assert rc == 1
    assert any("runs past the end" in p for p in problems)
    assert any("does not list" in p for p in problems)


def test_undeclared_and_missing_items_fail(ckpt_root, capsys):
    md = load_metadata(ckpt_root, 2)
    md.storage_data[MetadataIndex("ghost")] = md.storage_data.pop(MetadataIndex("lr"))
    write_metadata(ckpt_root, 2, pickle.dumps(md))
    rc, report = _verify_json(capsys, ckpt_root, "--step", "2")
    problems = " ".join(report["steps"][0]["problems"])
    assert rc == 1 and "'ghost' belongs to no declared name" in problems and "'lr' has no stored bytes" in problems


def test_verify_and_ls_never_run_a_crafted_metadata(ckpt_root, tmp_path, capsys):
    marker = str(tmp_path / "RAN")
    md = load_metadata(ckpt_root, 2)
    md.planner_data = {"x": MakeDirPayload(marker)}
    write_metadata(ckpt_root, 2, pickle.dumps(md))
    rc, report = _verify_json(capsys, ckpt_root)
    assert rc == 1
    assert any("not among the classes DCP metadata is made of" in p
               for p in report["steps"][-1]["problems"])
    assert cli(["ls", ckpt_root, "--json"]) == 0
    assert not os.path.exists(marker)


def test_orphans_and_stale_rank_indexes_warn_and_fail_only_when_strict(ckpt_root, capsys):
    with open(step_path(ckpt_root, 2, "__0_9-stray.distcp"), "wb") as f:
        f.write(b"left behind")
    index_path = step_path(ckpt_root, 2, "ranks", "0.json")
    with open(index_path) as f:
        index = json.load(f)
    index["save_id"] += 1  # an index of another attempt at this step
    with open(index_path, "w") as f:
        json.dump(index, f)
    rc, report = _verify_json(capsys, ckpt_root, "--step", "2")
    warnings = report["steps"][0]["warnings"]
    assert rc == 0 and report["ok"] is True and report["steps"][0]["problems"] == []
    assert any("__0_9-stray.distcp" in w and "orphaned" in w for w in warnings)
    assert any("ranks/0.json" in w and "save" in w for w in warnings)
    rc, report = _verify_json(capsys, ckpt_root, "--step", "2", "--strict")
    assert rc == 1 and report["ok"] is False
    capsys.readouterr()
    assert cli(["verify", ckpt_root, "--step", "2"]) == 0
    assert "warning: step-00000002/__0_9-stray.distcp: orphaned" in capsys.readouterr().out


def test_intact_steps_have_no_findings(ckpt_root, capsys):
    rc, report = _verify_json(capsys, ckpt_root, "--strict")
    assert rc == 0
    assert [(s["step"], s["problems"], s["warnings"]) for s in report["steps"]] == [(1, [], []), (2, [], [])]
    assert load_manifest(ckpt_root, 2)["metadata_crc32c"]
