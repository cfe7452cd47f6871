"""Crash consistency with real kill -9: of the whole job (trainer + writer), and of the writer alone."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch

import ckptio
import ckptio.testing.wrappers
from ckptio._cli.main import main as cli
from ckptio.errors import WriterDiedError
from ckptio.testing.ranks import ScriptProcess, start_script

JOB = os.path.join(os.path.dirname(__file__), "crash_job.py")


def _start(root: str, local: str | None = None) -> ScriptProcess:
    # A new session makes the job a process group: killpg reaches the trainer and its writer together. Forked from
    # the rank fork server: each of the ~17 restarts would otherwise import torch again.
    return start_script(JOB, [root] + ([local] if local else []), env=dict(os.environ), new_session=True)


def _restored_line(proc: ScriptProcess) -> tuple[int | None, bool]:
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "restored", f"job printed {line!r}"
    return (None if line[1] == "none" else int(line[1])), line[2] == "1"


@pytest.mark.slow
@pytest.mark.parametrize("with_local_tier", [False, True])
def test_kill_9_whole_job_never_loses_committed_state(tmp_path, with_local_tier, capsys):
    root = str(tmp_path / "ckpt")
    local = str(tmp_path / "local") if with_local_tier else None
    rng = random.Random(1234 + with_local_tier)
    # 12 kills (was 20): with 1-6 saves and 0-2 s of jitter each, they land in staging, serialization, fsync, the
    # rank index and the manifest alike; each restart costs an interpreter, torch and a writer (~5 s on 2 cores).
    trials = 12 if not with_local_tier else 5
    newest_seen = -1
    for trial in range(trials):
        proc = _start(root, local)
        step, ok = _restored_line(proc)
        assert ok, f"restored step {step} is not bit-exact"
        if step is not None:
            assert step >= newest_seen, f"restored {step} after having seen {newest_seen}"
            newest_seen = step
        # Kill at a random moment while saves are flowing: after a random number of save() returns, plus jitter,
        # so kills land in staging, serialization, fsync, the rank index or the manifest. save() returns as soon
        # as the copy is launched (asynchronous staging), so the jitter spans a whole save's flush.
        saves = rng.randint(1, 6)
        for _ in range(saves):
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("saved")
        time.sleep(rng.uniform(0.0, 2.0))
        if trial == 0:  # one kill after a commit for sure: a fresh job's first commit can outlast the jitter
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(root, "latest")) and time.monotonic() < deadline:
                time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert newest_seen > 0, "no trial ever committed a step; the kill window is too short"
    capsys.readouterr()
    assert cli(["verify", root]) == 0


def test_killing_only_the_writer_gives_a_clear_error_then_recovers(tmp_path):
    root = str(tmp_path / "ckpt")
    state = {"w": torch.randn(256, 256)}
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, state).wait(timeout=120)
        pid = ck._writer.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while ck._writer.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the reader thread notices the closed pipe
        with pytest.raises(WriterDiedError, match="writer process exited"):
            ck.save(2, state)
        # A fresh writer takes the next save.
        h = ck.save(3, state)
        h.wait(timeout=120)
        assert ck.latest_step() == 3
        target = {"w": torch.zeros(256, 256)}
        assert ck.restore(target) == 3
    assert torch.equal(target["w"], state["w"])


def test_killing_the_writer_mid_save_fails_that_save_only(tmp_path):
    root = str(tmp_path / "ckpt")
    slow = ckptio.testing.wrappers.ThrottledStorage(ckptio.storage.PosixStorage(root), write_bytes_per_s=2 << 20)
    state = {"w": torch.randn(1024, 1024)}  # 4 MiB at 2 MiB/s: the writer is busy for ~2 s
    with ckptio.Checkpointer(slow) as ck:
        h = ck.save(1, state)
        time.sleep(0.5)
        os.kill(ck._writer.pid, signal.SIGKILL)
        with pytest.raises(WriterDiedError):
            h.wait(timeout=60)
        with pytest.raises(WriterDiedError):
            ck.save(2, state)
        ck.save(3, state).wait(timeout=120)
        assert ck.latest_step() == 3
