"""Loud and bounded (issue 09, item 4): close() raises what failed, never hangs, and a dead writer fails every rank.

Real writer processes, real SIGSTOP and SIGKILL, real gloo ranks.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

import ckptio
from ckptio import format as fmt
from ckptio._proc import pid_alive
from ckptio.engine.trainer.staging_area import SHM_DIR, SLOT_PREFIX
from ckptio.errors import CkptError, CommitError, StorageError
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import FaultStorage, ThrottledStorage
from tests.engine.engine_workers import run_ranks


def _slot_files(pid: int) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SLOT_PREFIX}{pid}-")]


def test_close_raises_the_final_saves_failure_after_cleaning_up(root):
    # FaultStorage fails every write under step 2 (EIO): the real-file stand-in for a failing disk.
    store = FaultStorage(PosixStorage(root), errno_code=5, fail_keys_with="step-00000002")
    ck = ckptio.Checkpointer(store)
    ck.save(1, {"w": torch.ones(8)}).wait(timeout=120)
    ck.save(2, {"w": torch.ones(8)})
    writer_pid = ck._writer.pid
    with pytest.raises(StorageError, match="step-00000002"):
        ck.close()
    assert writer_pid is not None and not pid_alive(writer_pid)
    assert _slot_files(os.getpid()) == []
    ck.close()  # closed already: nothing left to raise
    assert fmt.committed_steps(PosixStorage(root)) == [1]


def test_a_failure_already_raised_by_wait_is_not_raised_again_by_close(root):
    store = FaultStorage(PosixStorage(root), errno_code=5, fail_keys_with="step-00000002")
    with ckptio.Checkpointer(store) as ck:
        h = ck.save(2, {"w": torch.ones(8)})
        with pytest.raises(StorageError):
            h.wait(timeout=120)
    # and the with-block's close() did not raise it again


def test_close_with_a_stopped_writer_is_bounded_kills_it_and_names_the_steps(root):
    slow = ThrottledStorage(PosixStorage(root), write_bytes_per_s=1 << 20)
    ck = ckptio.Checkpointer(slow, close_timeout_s=3.0)
    h = ck.save(4, {"w": torch.randn(1024, 1024)})  # 4 MiB at 1 MiB/s: pending for seconds
    pid = ck._writer.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(CommitError, match=r"steps \[4\]") as info:
            ck.close()
        assert info.value.step == 4
        assert not pid_alive(pid), "the stopped writer was not killed"
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    with pytest.raises(CommitError):
        h.wait(timeout=0)  # the handle is complete, and says the save failed
    assert _slot_files(os.getpid()) == []
    assert fmt.committed_steps(PosixStorage(root)) == []


def test_close_timeout_argument_overrides_the_option(root):
    slow = ThrottledStorage(PosixStorage(root), write_bytes_per_s=1 << 20)
    ck = ckptio.Checkpointer(slow)  # default close_timeout_s: half an hour
    ck.save(1, {"w": torch.randn(1024, 1024)})
    os.kill(ck._writer.pid, signal.SIGSTOP)
    with pytest.raises(CommitError, match="close"):
        ck.close(timeout=1.0)


def _rank_whose_writer_dies(rank: int, world_size: int, root: str, out: str) -> None:
    slow = ThrottledStorage(PosixStorage(root), write_bytes_per_s=1 << 20, state_path=os.path.join(out, "thr"))
    ck = ckptio.Checkpointer(slow, commit_timeout_s=60.0, close_timeout_s=120.0)
    # A key of its own per rank: a replicated tensor would be written by rank 0 only (DCP de-duplicates it), and
    # rank 1's writer would finish its empty share before the kill. 4 MiB per rank at 1 MiB/s: seconds to write.
    h = ck.save(1, {f"w{rank}": torch.randn(1024, 1024)})
    if rank == 1:
        h.wait_staged()  # the job is with the writer (staging is asynchronous), which is still writing it
        time.sleep(0.3)
        os.kill(ck._writer.pid, signal.SIGKILL)
    outcome = "committed"
    try:
        h.wait(timeout=110)  # commit_timeout_s bounds it; TimeoutError here would mean a hang
    except TimeoutError:
        outcome = "hung"
    except CkptError as exc:
        outcome = type(exc).__name__
    try:
        ck.close()
    except CkptError:
        pass
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump({"outcome": outcome, "slots": _slot_files(os.getpid())}, f)


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_writer_killed_on_rank_1_fails_the_save_on_every_rank(root, tmp_path):
    run_ranks(2, _rank_whose_writer_dies, root, str(tmp_path))
    results = []
    for r in range(2):
        with open(tmp_path / f"{r}.json") as f:
            results.append(json.load(f))
    assert results[1]["outcome"] == "WriterDiedError"
    assert results[0]["outcome"] == "CommitError", results
    assert results[0]["slots"] == [] and results[1]["slots"] == []
    assert fmt.committed_steps(PosixStorage(root)) == []
