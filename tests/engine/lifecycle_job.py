"""Jobs for the process-lifecycle tests: a script that ends without ``close()``, and one that forks while a
Checkpointer lives. Each is its own interpreter, so its exit, its signal handlers and its children are real.

Usage:
  python lifecycle_job.py ROOT exit       save(1), then save(2) with its copy still held back, then end the script
  python lifecycle_job.py ROOT exit_failing  the same on a store that fails step 2's writes
  python lifecycle_job.py ROOT collected  build a Checkpointer with no writer, drop it, end the script
  python lifecycle_job.py ROOT fork       fork pools and children while a Checkpointer lives; print what survived
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import weakref

import torch

import ckptio
from ckptio.engine.trainer.staging_area import SHM_DIR, SLOT_PREFIX
from ckptio.errors import WriterDiedError
from ckptio.storage import PosixStorage
from ckptio.testing.staging import hold_staging
from ckptio.testing.wrappers import FaultStorage


def slot_files(pid: int) -> list[str]:
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(f"{SLOT_PREFIX}{pid}-"))


def end_without_close(root: str) -> None:
    ck = ckptio.Checkpointer(root)
    state = {"w": torch.full((512, 1024), 1.0)}  # 2 MiB
    ck.save(1, state).wait()
    state["w"].add_(1.0)
    hold_staging(ck, 0.5)  # step 2's copy has not even started when the script ends
    ck.save(2, state)


def end_without_close_failing(root: str) -> None:
    """As ``exit``, on a store that fails every write of step 2 (EIO): the exit must say so, not hide it."""
    ck = ckptio.Checkpointer(FaultStorage(PosixStorage(root), errno_code=5, fail_keys_with="step-00000002"))
    state = {"w": torch.full((512, 1024), 1.0)}
    ck.save(1, state).wait()
    ck.save(2, state)


def collected(root: str) -> None:
    ck = ckptio.Checkpointer(root, start_writer="on_first_save")
    ref = weakref.ref(ck)
    del ck
    gc.collect()
    print(json.dumps({"collected": ref() is None}), flush=True)


def _busy(marker: str) -> None:
    """A pool task that says it runs, then sleeps: a SIGTERM then always finds a Python frame to run its handler in
    (an idle worker blocked inside the pool's queue does not always get to it before it dies)."""
    with open(f"{marker}-{os.getpid()}", "w"):
        pass
    time.sleep(120)


def fork_children(root: str) -> None:
    """Terminate a fork pool's workers (SIGTERM), end a forked child the way a script ends (its exit hooks run),
    then kill the writer: the restarted one maps the same slot files, so they must still be there."""
    ck = ckptio.Checkpointer(root, commit_timeout_s=60.0)
    state = {"w": torch.full((256, 256), 1.0)}
    ck.save(1, state).wait(timeout=120)
    report: dict[str, object] = {"slots_before": slot_files(os.getpid())}
    pool = multiprocessing.get_context("fork").Pool(2)
    markers = tempfile.mkdtemp()
    pool.map_async(_busy, [os.path.join(markers, "worker")] * 2)
    while len(os.listdir(markers)) < 2:
        time.sleep(0.05)
    pool.terminate()  # SIGTERM to every worker
    pool.join()
    report["slots_after_pool"] = slot_files(os.getpid())
    child = os.fork()
    if child == 0:
        # The child ends as a script does: exit hooks (the staging module's, ckptio's exit guard) run here.
        sys.exit(0)
    report["child_status"] = os.waitpid(child, 0)[1]
    report["slots_after_child"] = slot_files(os.getpid())
    os.kill(ck._writer.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    outcomes = []
    for step in range(2, 6):  # the first save after the death raises it (and restarts the writer)
        state["w"].fill_(float(step))
        try:
            ck.save(step, state).wait(timeout=120)
            outcomes.append([step, "committed"])
            break
        except WriterDiedError:
            outcomes.append([step, "WriterDiedError"])
        except ckptio.errors.CkptError as exc:
            outcomes.append([step, f"{type(exc).__name__}: {exc}"])
        assert time.monotonic() < deadline
    report["outcomes"] = outcomes
    ck.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    modes = {"exit": end_without_close, "exit_failing": end_without_close_failing, "collected": collected,
             "fork": fork_children}
    modes[sys.argv[2]](sys.argv[1])
