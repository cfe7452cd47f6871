"""No rank waits for a peer that failed: real gloo ranks, one of which cannot restore (it sees an older root, or is
stuck before the gate), or dies while another waits for its half of a replicated tensor.

Each scenario runs under a deadline far above what it needs (a hang detector: before the readiness gate, rank 0
waited in DCP's plan gather until the side group's 30-minute timeout)."""

from __future__ import annotations

import os
import shutil
import signal
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
    step = restore_step(ctx, state).step
    return {"step": step, "ok": bool(torch.equal(state["shared"], _state(step or 0)["shared"]))}


def test_a_rank_that_sees_an_older_root_restores_what_rank_0_chose(saved, tmp_path):
    root, older = saved
    # Rank 0 reads the step's records once for the job: rank 1 reads neither its manifest nor its .metadata, and
    # rank 0 reads the one data file and sends rank 1 its ranges, each checked against rank 0's records.
    first, second = run_outcomes(2, _restore_from, str(tmp_path), [root, older], {})
    assert [(r["step"], r["ok"]) for r in (first, second)] == [(7, True), (7, True)], (first, second)


def test_a_rank_that_must_read_what_its_older_root_lacks_fails_every_rank(saved, tmp_path):
    root, older = saved
    # 4 MiB tasks: rank 1 reads half of the file from its own root, which lacks the step.
    first, second = run_outcomes(2, _restore_from, str(tmp_path), [root, older], {"chunk_bytes": 4 << 20})
    # Rank 1's read fails; it still sends what it has (no peer waits), rank 0 rejects those bytes by their
    # checksums, and every rank raises the cause: rank 1's missing file, not rank 0's checksum.
    for report in (first, second):
        assert report is not None and report["raised"] == "NotFoundError", report
        assert "ckpt-older" in report["message"] and ".distcp" in report["message"], report


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


def _die_when_reading() -> None:
    """From now on, this rank dies (kill -9) the moment its transfer starts reading a range."""
    from ckptio.engine.restore.transfer import Transfer

    def die(self, items):
        os.kill(os.getpid(), signal.SIGKILL)

    Transfer._read_batch = die  # type: ignore[method-assign]


def _lost_mid_exchange(rank: int, world: int, root: str) -> dict:
    if rank == 1:
        _die_when_reading()
    # 4 MiB tasks: rank 0 reads the first half of "shared", rank 1 the second, each sends its half to the other.
    return _restore_from(rank, world, [root, root], {"chunk_bytes": 4 << 20})


def test_a_rank_killed_during_the_exchange_is_a_peer_lost_error(saved, tmp_path):
    root, _ = saved
    first, second = run_outcomes(2, _lost_mid_exchange, str(tmp_path), root, wait_for=[0])
    assert second is None  # killed before it could report
    assert first is not None and first["raised"] == "PeerLostError", first
    assert first["context"]["rank"] == 1 and first["context"]["phase"] == "exchange", first


SHARED_TWO_LEVELS = 6 << 20  # 24 MiB of float32: a 16 MiB task for rank 0 and an 8 MiB one for rank 1


def _two_levels_lost_mid_exchange(rank: int, world: int, base: str) -> dict:
    os.environ["CKPTIO_PARTNER_HOST"] = "127.0.0.1"
    ck = ckptio.Checkpointer(os.path.join(base, "root"), local_dir=os.path.join(base, f"local-n{rank}"),
                             node_id=f"n{rank}", durable_every=2, lease_s=0, fsync=False, volume_check="off",
                             partner_timeout_s=20.0)
    ck.save(1, {"shared": torch.arange(SHARED_TWO_LEVELS, dtype=torch.float32)}).wait(timeout=300)  # local only
    torch.distributed.barrier()
    if rank == 1:
        _die_when_reading()
    ck.restore({"shared": torch.zeros(SHARED_TWO_LEVELS)})
    return {"level": ck.last_restore.level if ck.last_restore else None}


def test_a_rank_killed_during_a_two_level_exchange_is_a_peer_lost_error(tmp_path):
    first, second = run_outcomes(2, _two_levels_lost_mid_exchange, str(tmp_path), str(tmp_path), wait_for=[0])
    assert second is None
    assert first is not None and first["raised"] == "PeerLostError", first
    assert first["context"]["rank"] == 1 and first["context"]["phase"] == "exchange", first
