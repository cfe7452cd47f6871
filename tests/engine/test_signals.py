"""Signals (issue 09, item 8): SIGTERM frees the staging memory, Ctrl-C never loses the save in flight.

Real jobs in their own process group (as a terminal or a scheduler starts them), real signals, real /dev/shm.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

import ckptio
from ckptio import format as fmt
from ckptio._proc import pid_alive
from ckptio.engine.trainer.staging_area import SHM_DIR, SLOT_PREFIX
from ckptio.storage import PosixStorage

JOB = os.path.join(os.path.dirname(__file__), "signal_job.py")


def _slot_files(pid: int) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SLOT_PREFIX}{pid}-")]


def _start(root: str, mode: str) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen([sys.executable, JOB, root, mode], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "saved", f"job printed {line!r}"
    return proc, int(line[1]), int(line[2])


def _wait_gone(pid: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid), f"process {pid} still running"


@pytest.mark.slow
def test_sigterm_frees_the_staging_slots_and_the_save_in_flight_completes_or_is_marked_failed(root):
    proc, pid, writer = _start(root, "sigterm")
    with proc:
        try:
            _check_sigterm(root, proc, pid, writer)
        finally:  # a failed check must not leave the job (or its writer) running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _check_sigterm(root: str, proc: subprocess.Popen[str], pid: int, writer: int) -> None:
    os.kill(pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # the default action still ends the process
    assert _slot_files(pid) == [], "a state-sized /dev/shm slot outlived the trainer"
    _wait_gone(writer)  # the orphaned writer finishes (bounded by commit_timeout_s) and exits
    storage = PosixStorage(root)
    committed = fmt.committed_steps(storage) == [1]
    marked = any(n.endswith(".json") for n in os.listdir(os.path.join(root, "step-00000001", "failed"))) if \
        os.path.isdir(os.path.join(root, "step-00000001", "failed")) else False
    assert committed or marked, "the save in flight was neither committed nor marked failed"
    assert _slot_files(writer) == []


@pytest.mark.slow
def test_ctrl_c_reaches_only_the_trainer_and_the_save_in_flight_commits(root):
    proc, pid, writer = _start(root, "sigint")
    with proc:
        try:
            _check_ctrl_c(root, proc, pid, writer)
        finally:  # a failed check must not leave the job (or its writer) running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _check_ctrl_c(root: str, proc: subprocess.Popen[str], pid: int, writer: int) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole foreground process group
    code = proc.wait(timeout=180)
    assert code != 0  # the KeyboardInterrupt still ends the job...
    assert fmt.committed_steps(PosixStorage(root)) == [1]  # ...after close() let the writer commit the save
    _wait_gone(writer, timeout=30)
    assert _slot_files(pid) == [] and _slot_files(writer) == []


def test_the_sigterm_handler_is_installed_only_when_nobody_else_handles_sigterm(root):
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with ckptio.Checkpointer(root, start_writer="on_first_save"):
        ours = signal.getsignal(signal.SIGTERM)
        assert callable(ours)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back at close

    def users(signum, frame):  # a training script's own handler (say, to save once more and exit)
        pass

    previous = signal.signal(signal.SIGTERM, users)
    try:
        with ckptio.Checkpointer(root, start_writer="on_first_save"):
            assert signal.getsignal(signal.SIGTERM) is users
        assert signal.getsignal(signal.SIGTERM) is users
    finally:
        signal.signal(signal.SIGTERM, previous)
