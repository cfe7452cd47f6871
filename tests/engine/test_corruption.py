"""A flipped byte is found by ``ckptio verify`` and by restore; an intact copy on the other tier is used instead."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch

import ckptio
from ckptio._cli.main import main as cli
from ckptio.errors import ChecksumError

# Inside the tensor's bytes (torch.save's framing ends at 704): restore checks the bytes it uses, block by block;
# ``ckptio verify`` checks every byte of the file.
IN_TENSOR = 1000


def _flip_byte(path: str, offset: int = IN_TENSOR) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def _data_file(root: str, step: int) -> str:
    (path,) = glob.glob(os.path.join(root, f"step-{step:08d}", "__0_0-*.distcp"))
    return path


def test_verify_names_the_corrupt_file_and_restore_raises(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    state = {"w": torch.randn(128, 128)}
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, state).wait(timeout=120)
    capsys.readouterr()
    assert cli(["verify", root]) == 0
    _flip_byte(_data_file(root, 1))
    capsys.readouterr()
    assert cli(["verify", root, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert any("__0_0-" in p and "checksum" in p for p in report["steps"][0]["problems"])
    assert cli(["verify", root, "--step", "1"]) == 1
    assert "__0_0-" in capsys.readouterr().out
    with ckptio.Checkpointer(root) as ck, pytest.raises(ChecksumError, match=r"'w'.*__0_0-[0-9a-f]+\.distcp"):
        ck.restore({"w": torch.zeros(128, 128)})


def test_restore_prefers_intact_local_copy_and_falls_back_to_durable(tmp_path):
    root, local = str(tmp_path / "ckpt"), str(tmp_path / "local")
    state = {"w": torch.randn(128, 128)}
    with ckptio.Checkpointer(root, local_dir=local) as ck:
        ck.save(1, state).wait(timeout=120)
    assert os.path.exists(_data_file(local, 1)), "the local tier keeps the newest committed step"

    # Durable copy damaged, local intact: restore reads the local copy.
    _flip_byte(_data_file(root, 1))
    target = {"w": torch.zeros(128, 128)}
    with ckptio.Checkpointer(root, local_dir=local) as ck:
        assert ck.restore(target) == 1
    assert torch.equal(target["w"], state["w"])

    # Both damaged: a named checksum error, never silently wrong values.
    _flip_byte(_data_file(local, 1), offset=IN_TENSOR + 4096)
    with ckptio.Checkpointer(root, local_dir=local) as ck, pytest.raises(ChecksumError):
        ck.restore({"w": torch.zeros(128, 128)})

    # Durable repaired (flip back), local still damaged: restore falls back to durable.
    _flip_byte(_data_file(root, 1))
    target = {"w": torch.zeros(128, 128)}
    with ckptio.Checkpointer(root, local_dir=local) as ck:
        assert ck.restore(target) == 1
    assert torch.equal(target["w"], state["w"])
