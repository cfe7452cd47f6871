"""Bad input gets a named error from ckptio.errors, and nothing already committed is lost."""

from __future__ import annotations

import threading

import pytest
import torch

import ckptio
from ckptio.errors import (
    CheckpointNotFoundError,
    ConfigError,
    StorageError,
    StructureMismatchError,
    UnsupportedStateError,
    VolumePolicyError,
)


def test_unsupported_object_is_named_and_the_checkpointer_goes_on(root):
    with ckptio.Checkpointer(root) as ck:
        with pytest.raises(UnsupportedStateError, match="'lock'"):
            ck.save(1, {"w": torch.ones(3), "lock": threading.Lock()})
        with pytest.raises(UnsupportedStateError, match="sparse"):
            ck.save(2, {"s": torch.eye(3).to_sparse()})
        ck.save(3, {"w": torch.ones(3)}).wait(timeout=120)
        assert ck.latest_step() == 3


def test_wrong_structure_on_restore(root):
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, {"w": torch.ones(4, 4), "b": torch.ones(4)}).wait(timeout=120)
        with pytest.raises(StructureMismatchError, match="Size mismatch"):
            ck.restore({"w": torch.zeros(5, 4), "b": torch.zeros(4)})
        with pytest.raises(StructureMismatchError, match="missing"):
            ck.restore({"w": torch.zeros(4, 4), "missing": torch.zeros(4)})
        with pytest.raises(CheckpointNotFoundError):
            ck.restore({"w": torch.zeros(4, 4)}, step=99)
        target = {"w": torch.zeros(4, 4), "b": torch.zeros(4)}
        assert ck.restore(target) == 1  # the committed step is intact after the failed attempts
        assert torch.equal(target["w"], torch.ones(4, 4))


def test_root_that_cannot_be_written_fails_at_construction(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(StorageError) as info:
        ckptio.Checkpointer(str(not_a_dir / "ckpt"))
    assert str(not_a_dir) in str(info.value)


@pytest.mark.parametrize(
    "options",
    [{"max_pending": 0}, {"overflow": "drop"}, {"keep_last": -1}, {"every_steps": 0}, {"file_size_bytes": 10},
     {"max_pending": 1.5}, {"max_pendng": 2}],
)
def test_bad_options_raise_config_error(root, options):
    with pytest.raises(ConfigError):
        ckptio.Checkpointer(root, **options)


def test_root_on_the_dataset_volume_is_refused_when_volume_check_is_error(tmp_path):
    data = tmp_path / "dataset"
    data.mkdir()
    root = tmp_path / "runs with space é" / "ckpt"
    with pytest.raises(VolumePolicyError, match="share one volume"):
        ckptio.Checkpointer(str(root), data_dirs=[str(data)], volume_check="error")
    with ckptio.Checkpointer(str(root), data_dirs=[str(data)], volume_check="warn", start_writer="on_first_save"):
        pass  # a warning only
