"""Someone who can write to the checkpoint root cannot run code in a restoring job, and cannot steer ckptio's
writes or deletions outside what it owns. Real Checkpointers (writer processes), real files, tampered on disk with
every checksum fixed, so only the trust model and containment stand in the way. Retention's containment (a
manifest naming another step's file, a key through a symlink, junk step names) is held by
tests/format/test_containment.py."""

from __future__ import annotations

import dataclasses
import os
import pickle

import pytest
import torch

import ckptio
from ckptio.errors import CkptError, UntrustedCheckpointError
from tests.format.tamper import (
    MakeDirPayload,
    load_metadata,
    replace_value,
    write_metadata,
)


def _state(v: float = 1.0) -> dict:
    return {"w": torch.full((4, 4), v), "lr": 0.1, "name": "x"}


def test_restore_never_runs_a_crafted_metadata_or_value(root, tmp_path):
    """Repro: a crafted ``.metadata`` whose manifest checksum was fixed ran its payload on restore, even for a
    tensor-only target; non-tensor values were loaded with ``torch.load(weights_only=False)``."""
    marker = str(tmp_path / "RAN")
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        for step in (1, 2):
            ck.save(step, _state(step)).wait(timeout=120)
    md = load_metadata(root, 2)
    md.planner_data = {"w": MakeDirPayload(marker)}
    write_metadata(root, 2, pickle.dumps(md))  # the manifest's metadata_crc32c is fixed too
    replace_value(root, 1, "lr", {"lr": MakeDirPayload(marker)})  # data file checksum fixed in the manifest

    with ckptio.Checkpointer(root, start_writer="on_first_save") as ck:
        with pytest.raises(UntrustedCheckpointError, match=r"makedirs") as info:
            ck.restore({"w": torch.zeros(4, 4)})
        assert info.value.step == 2
        with pytest.raises(UntrustedCheckpointError, match=r"'lr'.*makedirs"):
            ck.restore({"w": torch.zeros(4, 4), "lr": 0.0}, step=1)
        tensors_only = {"w": torch.zeros(4, 4)}
        assert ck.restore(tensors_only, step=1) == 1  # the damaged value is not read for a target without it
    assert torch.equal(tensors_only["w"], torch.full((4, 4), 1.0))
    assert not os.path.exists(marker)


@dataclasses.dataclass
class Schedule:
    warmup: int


def test_user_classes_need_the_allowlist_or_the_explicit_opt_in(root):
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, {"w": torch.ones(2), "sched": Schedule(100)}).wait(timeout=120)
    with ckptio.Checkpointer(root, start_writer="on_first_save") as ck, \
            pytest.raises(UntrustedCheckpointError, match="Schedule"):
        ck.restore({"w": torch.zeros(2), "sched": None})
    for options in ({"safe_globals": [Schedule]}, {"trust_pickles": True}):
        target = {"w": torch.zeros(2), "sched": None}
        with ckptio.Checkpointer(root, start_writer="on_first_save", **options) as ck:
            assert ck.restore(target) == 1
        assert target["sched"] == Schedule(100), options
    with pytest.raises(ckptio.errors.ConfigError, match="safe_globals"):
        ckptio.Checkpointer(root, safe_globals=["not a class"])


def test_a_symlinked_step_directory_is_refused_not_written_through(root, tmp_path):
    """Repro: ``step-00000005`` pre-created as a symlink to an outside directory: save(5) wrote the whole step
    there and deleted a foreign ``*.distcp`` in it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "__0_0-foreign.distcp").write_bytes(b"foreign")
    os.symlink(outside, os.path.join(root, "step-00000005"))
    with ckptio.Checkpointer(root) as ck:
        ck.save(4, _state(4)).wait(timeout=120)
        with pytest.raises(CkptError, match="symbolic link"):
            ck.save(5, _state(5)).wait(timeout=120)
        ck.save(6, _state(6)).wait(timeout=120)
        target = _state(0)
        assert ck.restore(target) == 6
    assert sorted(os.listdir(outside)) == ["__0_0-foreign.distcp"]
    assert (outside / "__0_0-foreign.distcp").read_bytes() == b"foreign"
