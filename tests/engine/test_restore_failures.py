"""No rank waits for a peer that failed: real gloo ranks, one of which cannot restore (it sees an older root, or is
stuck before the gate), or dies while another waits for its half of a replicated tensor.

Each scenario runs under a deadline far above what it needs (a hang detector: before the readiness gate, rank 0
waited in DCP's plan gather until the side group's 30-minute timeout)."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

import ckptio
from ckptio.engine.restore.context import ReadOptions, RestoreContext
from ckptio.engine.restore.step_restore import restore_step
from ckptio.engine.side_group import SideGroup
from ckptio.storage import open_storage
from tests.engine.rank_outcomes import run_outcomes

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

N = 1 << 21  # 8 MiB of float32: two 4 MiB tasks when tasks are 4 MiB


def _state(seed: int) -> dict:
    return {"shared": torch.arange(N, dtype=torch.float32) + seed, "info": {"seed": seed}}


@pytest.fixture
def saved(root):
    """A root with steps 5 and 7 committed (one process), and a copy of it that has only step 5: an older root."""
    with ckptio.Checkpointer(root, volume_check="off") as ck:
        for step in (5, 7):
            ck.save(step, _state(step)).wait(timeout=300)
    older = root + "-older"
    shutil.copytree(root, older)
    shutil.rmtree(os.path.join(older, "step-00000007"))
    os.unlink(os.path.join(older, "latest"))
    return root, older


def _restore_from(rank: int, world: int, roots: list[str], options: dict) -> dict:
    state = {"shared": torch.zeros(N), "info": {}}
    ctx = RestoreContext(open_storage(roots[rank]), SideGroup(), options=ReadOptions(**options))
    step = restore_step(ctx, state)
    return {"step": step, "ok": bool(torch.equal(state["shared"], _state(step or 0)["shared"]))}


def test_a_rank_that_sees_an_older_root_fails_every_rank_at_once(saved, tmp_path):
    root, older = saved
    reports = run_outcomes(2, _restore_from, str(tmp_path), [root, older], {})
    first, second = reports
    assert second is not None and second["raised"] == "CheckpointNotFoundError", second
    # Rank 0 chose step 7, which rank 1 cannot see: rank 0 raises the same class, naming rank 1 and its reason.
    assert first is not None and first["raised"] == "CheckpointNotFoundError", first
    assert first["context"]["rank"] == 1 and "rank 1 could not start the restore" in first["message"], first
    assert "no committed checkpoint" in first["message"], first


def _stuck_before_gate(rank: int, world: int, root: str) -> dict:
    if rank == 1:
        from ckptio.engine.restore.storage_reader import CkptioStorageReader

        def stuck(self, *args, **kwargs):  # a store that never answers
            time.sleep(3600)

        CkptioStorageReader.read_metadata = stuck  # type: ignore[method-assign]
    return _restore_from(rank, world, [root, root], {"ready_timeout_s": 5.0})


def test_a_rank_stuck_before_the_gate_is_named_after_the_bound(saved, tmp_path):
    root, _ = saved
    first, _ = run_outcomes(2, _stuck_before_gate, str(tmp_path), root, wait_for=[0])
    assert first is not None and first["raised"] == "PeerLostError", first
    assert first["context"] == {"step": 7, "rank": 1, "phase": "ready"}, first
