"""A directory a plain ``dcp.save`` wrote (no manifest, no rank index) is read by ``CkptioStorageReader`` and checked
by ``ckptio verify``, each item against the zip CRC-32s ``torch.save`` keeps inside it (DCP records no checksum);
``Checkpointer.restore`` takes it when it is the newest step (or the one asked for), and says so in ``last_restore``,
but never an uncommitted ckptio save."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
from ckptio import CkptioStorageReader
from ckptio._cli.main import main as cli
from ckptio.errors import CheckpointNotFoundError, ChecksumError
from ckptio.storage import open_storage


def _state() -> dict:
    return {"w": torch.arange(1 << 16, dtype=torch.float32), "o": {"lr": 0.5, "tags": ["x"]}}


def _blank() -> dict:
    return {"w": torch.zeros(1 << 16), "o": {"lr": 0.0, "tags": []}}


def _load(storage, step) -> dict:
    target = _blank()
    try:
        dcp.load(target, storage_reader=CkptioStorageReader(storage, step))
    except BaseException as exc:  # DCP wraps a rank's failure in a CheckpointException (a BaseException)
        failures = getattr(exc, "failures", None)
        if not failures:
            raise
        inner = next(iter(failures.values()))
        raise (inner[0] if isinstance(inner, tuple) else inner) from exc
    return target


def _flip_in_w(path: str) -> None:
    (name,) = [f for f in os.listdir(path) if f.endswith(".distcp")]
    with open(os.path.join(path, name), "rb") as f:
        data = bytearray(f.read())
    at = data.find(torch.arange(1 << 16, dtype=torch.float32).numpy().tobytes()[40000:40064])
    data[at] ^= 1
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)


def test_a_plain_dcp_directory_reads_and_a_flipped_byte_is_a_checksum_error(tmp_path):
    plain = str(tmp_path / "plain")
    dcp.save(_state(), checkpoint_id=plain)
    target = _load(open_storage(plain), None)
    assert torch.equal(target["w"], _state()["w"]) and target["o"] == _state()["o"]
    _flip_in_w(plain)
    with pytest.raises(ChecksumError, match="'w': record archive/data/0 fails its zip CRC-32"):
        _load(open_storage(plain), None)


def _verify(capsys, root: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = cli(["verify", root, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_verify_reports_a_plain_dcp_step_with_what_it_checked(tmp_path, capsys):
    root = str(tmp_path / "root")
    dcp.save(_state(), checkpoint_id=os.path.join(root, "step-00000005"))
    rc, report = _verify(capsys, root)
    (step,) = report["steps"]
    assert rc == 0 and step["step"] == 5 and step["level"] == "dcp" and step["ok"], report
    assert "DCP records no checksums" in step["notes"][0]
    _flip_in_w(os.path.join(root, "step-00000005"))
    rc, report = _verify(capsys, root)
    assert rc == 1 and any("fails its zip CRC-32" in p for p in report["steps"][0]["problems"]), report


def test_an_uncommitted_ckptio_save_is_never_read_as_plain_dcp(tmp_path):
    root = str(tmp_path / "root")
    with ckptio.Checkpointer(root, volume_check="off") as ck:
        ck.save(3, _state()).wait(timeout=120)
    attempt = os.path.join(root, "step-00000004")
    shutil.copytree(os.path.join(root, "step-00000003"), attempt)  # .metadata and ranks/, but no manifest
    os.unlink(os.path.join(attempt, "manifest.json"))
    with pytest.raises(CheckpointNotFoundError, match=r"manifest\.json is missing"):
        CkptioStorageReader(open_storage(root), 4)


# ---- Checkpointer.restore on a root whose steps dcp.save wrote (issue 21 item 1) ------------------------------
def _ck(root: str) -> ckptio.Checkpointer:
    return ckptio.Checkpointer(root, volume_check="off")


def test_restore_takes_the_newest_step_even_when_plain_dcp_wrote_it_and_says_so(tmp_path):
    root = str(tmp_path / "root")
    with _ck(root) as ck:
        ck.save(3, {"w": torch.zeros(1 << 16), "o": {"lr": 0.1, "tags": []}}).wait(timeout=120)
    dcp.save(_state(), checkpoint_id=os.path.join(root, "step-00000005"))  # a user moving from DCP
    with _ck(root) as ck:
        target = _blank()
        assert ck.restore(target) == 5
        assert torch.equal(target["w"], _state()["w"]) and target["o"] == _state()["o"]
        report = ck.last_restore
        assert report is not None and report.level == "dcp" and "plain DCP checkpoint" in (report.note or "")
        assert ck.restore(_blank(), step=5) == 5 and ck.last_restore.level == "dcp"
        target = {"w": torch.ones(1 << 16), "o": {"lr": 0.0, "tags": []}}
        assert ck.restore(target, step=3) == 3 and ck.last_restore.level == "durable"
        assert torch.equal(target["w"], torch.zeros(1 << 16))
        with pytest.raises(CheckpointNotFoundError, match=r"step-00000006/manifest\.json is missing"):
            ck.restore(_blank(), step=6)


def test_a_root_holding_only_a_plain_dcp_checkpoint_is_not_empty(tmp_path):
    root = str(tmp_path / "root")
    os.makedirs(root)
    dcp.save(_state(), checkpoint_id=os.path.join(root, "step-00000002"))
    with _ck(root) as ck:
        target = _blank()
        assert ck.restore(target) == 2 and torch.equal(target["w"], _state()["w"])


def test_an_uncommitted_ckptio_save_is_not_restored_as_plain_dcp(tmp_path):
    root = str(tmp_path / "root")
    with _ck(root) as ck:
        ck.save(3, _state()).wait(timeout=120)
    attempt = os.path.join(root, "step-00000004")
    shutil.copytree(os.path.join(root, "step-00000003"), attempt)
    os.unlink(os.path.join(attempt, "manifest.json"))
    with _ck(root) as ck:
        assert ck.restore(_blank()) == 3 and ck.last_restore.level == "durable"
