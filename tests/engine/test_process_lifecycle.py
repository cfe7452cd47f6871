"""A Checkpointer's process lifecycle: children forked while it lives, and an interpreter that exits without
``close()``. Real scripts in their own session (``lifecycle_job.py``), real fork, real SIGTERM/SIGKILL, real
/dev/shm; whatever a failed check leaves running is killed with its process group.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import subprocess
import sys
import time
import weakref

import pytest
import torch

import ckptio
from ckptio import format as fmt
from ckptio.engine import process_hooks
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import ThrottledStorage

JOB = os.path.join(os.path.dirname(__file__), "lifecycle_job.py")
EXIT_LINE = "ckptio: exiting without close()"


def _run_job(root: str, mode: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen([sys.executable, JOB, root, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:  # a hung job must not outlive the test, nor its forked children or writer
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _restored(root: str, step: int, shape: tuple[int, ...]) -> torch.Tensor:
    target = {"w": torch.zeros(shape)}
    with ckptio.Checkpointer(root, start_writer="on_first_save") as ck:
        assert ck.restore(target, step=step) == step
    return target["w"]


@pytest.mark.slow
def test_forked_children_leave_the_parents_staging_slots_and_a_restarted_writer_still_commits(root):
    result = _run_job(root, "fork")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["slots_before"], "the save did not stage through a slot file"
    # A fork pool's workers, terminated with SIGTERM, inherited ckptio's handler: it must not free the parent's slots.
    assert report["slots_after_pool"] == report["slots_before"]
    # A forked child that ends as a script does runs the exit hooks it inherited: they are not its to run.
    assert report["child_status"] == 0
    assert report["slots_after_child"] == report["slots_before"]
    # The writer was killed: the saves it had are reported as its death, then a fresh writer maps the slot again.
    outcomes = report["outcomes"]
    assert [o for _, o in outcomes[:-1]] == ["WriterDiedError"] * (len(outcomes) - 1)
    last_step, last = outcomes[-1]
    assert last == "committed", outcomes
    assert fmt.committed_steps(PosixStorage(root))[-1] == last_step
    assert torch.equal(_restored(root, last_step, (256, 256)), torch.full((256, 256), float(last_step)))


@pytest.mark.slow
def test_a_script_that_ends_right_after_save_commits_that_step_and_says_so(tmp_path):
    """Five runs, each ending with step 2's copy still held back: a silent loss or a SIGABRT in any one fails."""
    for run in range(5):
        root = str(tmp_path / f"run{run}")
        os.mkdir(root)
        result = _run_job(root, "exit")
        assert result.returncode == 0, f"run {run}: exit status {result.returncode}: {result.stderr}"
        assert "terminate called" not in result.stderr
        assert fmt.committed_steps(PosixStorage(root)) == [1, 2], f"run {run}: {result.stderr}"
        lines = [line for line in result.stderr.splitlines() if line.startswith(EXIT_LINE)]
        assert len(lines) == 1, result.stderr
        assert "(steps: 2)" in lines[0] and lines[0].endswith("step 2 committed"), lines[0]
        assert "close_timeout_s=1800 s" in lines[0]
    # The state at save(2), not before it.
    assert torch.equal(_restored(root, 2, (512, 1024)), torch.full((512, 1024), 2.0))


def test_a_save_that_fails_during_the_exit_is_reported_on_stderr(root):
    result = _run_job(root, "exit_failing")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(EXIT_LINE)]
    assert len(lines) == 1, result.stderr
    assert "(steps: 2)" in lines[0] and "step 2 failed (StorageError" in lines[0], lines[0]
    assert fmt.committed_steps(PosixStorage(root)) == [1]


@pytest.mark.slow
def test_a_checkpointer_that_was_garbage_collected_is_not_waited_for_at_exit(root):
    result = _run_job(root, "collected")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"collected": True}
    assert EXIT_LINE not in result.stderr


def test_close_takes_the_checkpointer_off_the_exit_guard(root):
    def guarded() -> list[object]:
        return process_hooks.at_exit_owners()

    ck = ckptio.Checkpointer(root, start_writer="on_first_save")
    assert ck in guarded()
    ck.close()
    assert ck not in guarded()
    # Collected without close: the registry forgets it (a weak reference), and holds nothing that keeps it alive.
    ck = ckptio.Checkpointer(root, start_writer="on_first_save")
    ref = weakref.ref(ck)
    del ck
    gc.collect()
    assert ref() is None
    assert all(obj is not None for obj in guarded())


def test_a_forked_child_closing_its_copy_leaves_the_parents_writer_alone(tmp_path):
    """A child forked while a Checkpointer lives that unwinds through ``with Checkpointer(...)`` (or calls close())
    must not stop the parent's writer (they share its pipe) nor release the parent's staging or root claim."""
    with ckptio.Checkpointer(str(tmp_path / "root"), lease_s=0, volume_check="off", fsync=False) as ck:
        ck.save(1, {"w": torch.ones(8)}).wait(timeout=120)
        pid = os.fork()
        if pid == 0:  # the child: close its copy and leave without running anything else of the parent's
            try:
                ck.close()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        ck.save(2, {"w": torch.full((8,), 2.0)}).wait(timeout=120)  # the writer still serves the parent
    assert fmt.committed_steps(PosixStorage(str(tmp_path / "root"))) == [1, 2]


def _public_methods() -> set[str]:
    names = {n for n in dir(ckptio.Checkpointer) if not n.startswith("_")
             and callable(getattr(ckptio.Checkpointer, n))}
    return names | {"__enter__", "__exit__"}


def test_every_public_method_of_a_parents_checkpointer_refuses_at_once_in_a_forked_child(root):
    """Issue 21, item 8: a child forked while a save is in flight (a slow store keeps it there) that calls the
    parent's Checkpointer gets CheckpointerForkedError at once from every method; ``close()`` (and ``__exit__``)
    do nothing there. Before, ``wait()`` and ``save()`` waited forever for a writer answer and a staging slot."""
    state = {"w": torch.ones(1 << 20)}  # 4 MiB through a 1 MiB/s store: seconds in flight
    ck = ckptio.Checkpointer(ThrottledStorage(PosixStorage(root), write_bytes_per_s=1 << 20), max_pending=1,
                             every_steps=1, commit_timeout_s=120)
    calls = {
        "save": lambda: ck.save(2, state), "maybe_save": lambda: ck.maybe_save(2, state),
        "emergency_save": lambda: ck.emergency_save(2, state), "restore": lambda: ck.restore(state),
        "wait": ck.wait, "wait_staged": ck.wait_staged, "guard": ck.guard, "writer_ready": ck.writer_ready,
        "pending_steps": ck.pending_steps, "pending_saves": ck.pending_saves, "latest_step": ck.latest_step,
        "step_timer": lambda: ck.step_timer(1), "step_begin": lambda: ck.step_begin(1),
        "step_end": lambda: ck.step_end(1), "__enter__": ck.__enter__,
        "close": ck.close, "__exit__": lambda: ck.__exit__(None, None, None),  # documented no-ops
    }
    assert set(calls) == _public_methods(), "a public method is missing from this test"
    handle = ck.save(1, state)
    handle.wait_staged()
    assert not handle.done()  # the save is in flight when the child is forked
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one line per call, then leave without running anything of the parent's
        try:
            with os.fdopen(write_fd, "w") as out:
                for name, call in calls.items():
                    try:
                        call()
                        outcome = "returned"
                    except BaseException as exc:
                        outcome = type(exc).__name__
                    out.write(json.dumps([name, outcome]) + "\n")
                    out.flush()
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        outcomes = dict(json.loads(line) for line in _lines_within(read_fd, 60.0))
    finally:
        os.close(read_fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    expected = {name: "CheckpointerForkedError" for name in calls} | {"close": "returned", "__exit__": "returned"}
    assert outcomes == expected
    handle.wait(timeout=120)  # the parent's save and writer were left alone
    ck.close()
    assert fmt.committed_steps(PosixStorage(root)) == [1]


def _lines_within(fd: int, timeout: float) -> list[str]:
    """Every line written to ``fd`` until it closes; AssertionError naming the calls done when ``timeout`` passes
    first (a child that hangs)."""
    data = b""
    deadline = time.monotonic() + timeout
    while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return data.decode().splitlines()
        data += chunk
    done = [json.loads(line)[0] for line in data.decode().splitlines()]
    raise AssertionError(f"the child hung after {done}")
