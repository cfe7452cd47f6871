"""One job per root, and nothing ckptio did not write is ever deleted, through whole Checkpointers.

Retention's own rules (keep_last, leftovers, retired records, fresh markers) are held in one process by
tests/engine/writer/test_retention.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ckptio
from ckptio import format as fmt
from ckptio.errors import RootInUseError
from ckptio.storage import PosixStorage


def test_a_second_job_on_the_same_root_is_refused_until_the_first_closes(root):
    first = ckptio.Checkpointer(root)
    try:
        with pytest.raises(RootInUseError, match="owns this root"):
            ckptio.Checkpointer(root)
    finally:
        first.close()
    with ckptio.Checkpointer(root) as again:
        assert again.latest_step() is None


def test_a_dead_owner_frees_the_root_at_once(root):
    # A job that claims the root and exits without closing (like kill -9) leaves a stale owner record.
    code = f"import os, ckptio; ck = ckptio.Checkpointer({root!r}); os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert os.path.exists(os.path.join(root, ".ckptio-owner.json"))
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, {"w": torch.ones(2)}).wait(timeout=120)


def _dcp_save(path: str, value: float) -> dict:
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.full((64,), value)}
    dcp.save(state, checkpoint_id=path)
    return state


def test_nothing_ckptio_did_not_write_is_deleted_by_retention_rollback_or_cleanup(root):
    """Issue 21 item 1: plain DCP checkpoints (``dcp.save`` to root/step-00000005 and step-00000020: ``.metadata``
    and ``__0_0.distcp``), a user's folder and a user's file beside a crashed ckptio attempt all outlive retention
    (keep_last=2), a rollback, and the leftover sweeps at start and close; the crashed attempt's own keys go."""
    dcp_dirs = [os.path.join(root, fmt.step_dir(s)) for s in (5, 20)]
    for path, value in zip(dcp_dirs, (5.0, 20.0), strict=True):
        _dcp_save(path, value)
    dcp_files = [sorted(os.listdir(p)) for p in dcp_dirs]
    assert ".metadata" in dcp_files[0] and any(n.endswith(".distcp") for n in dcp_files[0])
    user = os.path.join(root, fmt.step_dir(3), "notes")
    os.makedirs(user)
    with open(os.path.join(user, "README"), "w") as f:
        f.write("mine")
    crashed = os.path.join(root, fmt.step_dir(4))  # a ckptio attempt that died before its commit, plus a user file
    os.makedirs(os.path.join(crashed, "ranks"))
    for name in ("__0_0-00000000000aa.distcp", "ranks/0.json", ".metadata", "mine.txt"):
        with open(os.path.join(crashed, name), "wb") as f:
            f.write(b"x")
    with ckptio.Checkpointer(root, keep_last=2, lease_s=0) as ck:
        for step in (6, 7, 8):
            ck.save(step, {"w": torch.full((64,), float(step))}).wait(timeout=120)
        assert ck.restore({"w": torch.zeros(64)}, step=7) == 7
        ck.save(9, {"w": torch.full((64,), 9.0)}).wait(timeout=120)  # rolls back: step 8 is retired
    assert fmt.committed_steps(PosixStorage(root)) == [7, 9]
    assert [sorted(os.listdir(p)) for p in dcp_dirs] == dcp_files
    assert os.path.exists(os.path.join(user, "README"))
    assert sorted(os.listdir(crashed)) == [".metadata", "mine.txt"]  # its own keys went; .metadata stays beside
    with ckptio.Checkpointer(root, keep_last=1, lease_s=0) as ck:  # the next run's start and close sweep again
        # The newest step is plain DCP's step 20: restore adopts it (issue 21), and saving 10 after it deletes
        # nothing of it (a rollback retires ckptio's own steps only).
        assert ck.restore({"w": torch.zeros(64)}) == 20 and ck.last_restore.level == "dcp"
        ck.save(10, {"w": torch.full((64,), 10.0)}).wait(timeout=120)
    assert fmt.committed_steps(PosixStorage(root)) == [10]
    assert [sorted(os.listdir(p)) for p in dcp_dirs] == dcp_files and os.path.exists(os.path.join(user, "README"))
    for path, value in zip(dcp_dirs, (5.0, 20.0), strict=True):
        restored = {"w": torch.zeros(64)}
        _dcp_load(path, restored)
        assert torch.equal(restored["w"], torch.full((64,), value))  # still whole DCP checkpoints


def _dcp_load(path: str, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=path)
