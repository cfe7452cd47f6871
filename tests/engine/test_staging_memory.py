"""Staging memory: slots live in ``staging_dir``, and a directory too small for ``max_pending`` slots is a named
error on the first save, before a byte is staged or a job reaches the writer."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest
import torch

from ckptio import Checkpointer
from ckptio.engine.trainer.staging_area import SLOT_PREFIX, StagingArea
from ckptio.errors import ConfigError, StorageFullError
from ckptio.format.layout import RankLayout

MiB = 1 << 20


def _slots(directory) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(f"{SLOT_PREFIX}{os.getpid()}-")]


@contextlib.contextmanager
def small_tmpfs(path, size: str):
    """A real tmpfs of ``size`` at ``path``; skips the test where mounting is not permitted."""
    path.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=False,
                              capture_output=True, text=True)
    except OSError as exc:  # no mount binary
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_too_small_staging_dir_fails_the_first_save_naming_bytes_dir_and_fixes(root, tmp_path):
    state = {"w": torch.randn(4 * MiB // 4), "b": torch.randn(3 * MiB // 4)}  # 7 MiB per slot
    with small_tmpfs(tmp_path / "shm", "8m") as shm:
        ck = Checkpointer(root, staging_dir=str(shm), max_pending=2, start_writer="on_first_save", lease_s=0)
        try:
            with pytest.raises(StorageFullError) as info:
                ck.save(1, state)
            message = str(info.value)
            assert str(shm) in message and "--shm-size" in message and "staging_dir=" in message
            assert "max_pending" in message
            need = int(message.split("staging needs ")[1].split(" more bytes", maxsplit=1)[0].replace(",", ""))
            assert need >= 2 * 7 * MiB
            assert _slots(shm) == [], "a byte was staged"
            assert ck._writer.pid is None, "a writer was started (and sent the plan) for a save that cannot stage"
            assert not any(n.startswith("step-") for n in os.listdir(root))
            # One slot fits: the documented fix works without restarting anything.
        finally:
            ck.close()
        with Checkpointer(root, staging_dir=str(shm), max_pending=1, lease_s=0) as ck:
            ck.save(1, state).wait(120)
            assert len(_slots(shm)) == 1
        restored = {k: torch.zeros_like(v) for k, v in state.items()}
        with Checkpointer(root, lease_s=0, start_writer="on_first_save") as ck:
            assert ck.restore(restored) == 1
        assert all(torch.equal(restored[k], state[k]) for k in state)


def _layout(slot_bytes: int) -> RankLayout:
    return RankLayout(rank=0, tensors=(), objects=(), slot_bytes=slot_bytes, n_files=0)


def test_check_fits_compares_with_the_directorys_real_free_space(tmp_path):
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    area = StagingArea(2, str(tmp_path))
    area.check_fits(_layout(free // 4))  # two slots of a quarter fit
    with pytest.raises(StorageFullError, match="2 slot"):
        area.check_fits(_layout(free // 2 + MiB))


def test_slots_already_allocated_are_counted_as_reused(tmp_path):
    area = StagingArea(2, str(tmp_path))
    try:
        area.acquire(0, _layout(MiB))
        assert area.bytes_to_allocate(_layout(MiB)) == MiB  # only the second slot is new
        # A bigger layout replaces the first slot: its bytes are given back first.
        assert area.bytes_to_allocate(_layout(3 * MiB)) == 2 * MiB + 3 * MiB
        assert len(_slots(tmp_path)) == 1
    finally:
        area.close()
    assert _slots(tmp_path) == []


def test_a_staging_dir_that_does_not_exist_is_a_config_error(root, tmp_path):
    with pytest.raises(ConfigError, match="staging_dir"):
        Checkpointer(root, staging_dir=str(tmp_path / "missing"), start_writer="on_first_save", lease_s=0)
