"""The process-wide hooks (``engine.process_hooks``, issue 22): their stated order at exit, after a fork and on
SIGTERM, whatever order things registered in; and SIGTERM acted on while the main thread is blocked in native code
(issue 21 item 5), including a preemption hold's duplicate window (issue 24).

Real processes (``hooks_job.py``: no torch, so each starts in well under a second), real signals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from ckptio.engine import process_hooks

JOB = os.path.join(os.path.dirname(__file__), "hooks_job.py")


class Job:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, JOB, *args], stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)

    def expect(self, line: str) -> None:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().strip()
        assert got == line, f"expected {line!r}, got {got!r}"

    def rest(self, timeout: float = 30.0) -> tuple[int, list[str]]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out.splitlines()

    def alive_after(self, seconds: float) -> bool:
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return True
        return False

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def job_factory():
    jobs: list[Job] = []

    def make(*args: str) -> Job:
        jobs.append(Job(*args))
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()


def test_at_exit_the_exit_actions_run_before_the_release_actions_whatever_the_registration_order(job_factory):
    code, lines = job_factory("order").rest()
    assert code == 0
    assert lines == ["exit", "release-1", "release-2"]


def test_a_forked_child_forgets_every_registration_and_gets_sigterms_default_back(job_factory):
    code, lines = job_factory("fork").rest()
    assert code == 0
    # The child ran its exit hook and found nothing of the parent's; the parent's actions ran once, in order.
    assert lines == ["child would close 0", "child sigterm default True", "parent exits", "exit", "release-1",
                     "release-2"]


def test_sigterm_releases_then_kills_while_the_main_thread_is_blocked_in_native_code(job_factory):
    job = job_factory("native")
    job.expect("blocked")
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGTERM)
    code, lines = job.rest(timeout=20)
    assert code == -signal.SIGTERM
    assert lines == ["release-1"]
    assert time.monotonic() - t0 < 20


def test_a_users_handler_installed_after_ckptios_gets_sigterm_and_ckptio_does_nothing(job_factory):
    job = job_factory("user")
    job.expect("waiting")
    os.kill(job.proc.pid, signal.SIGTERM)
    job.expect("user handler")
    assert job.alive_after(1.0)  # the user's handler decides; ckptio's watcher neither released nor killed


@pytest.mark.parametrize("later_s", [2.0])
def test_a_preemption_hold_absorbs_a_duplicate_within_the_window_and_dies_of_a_later_sigterm(job_factory, later_s):
    job = job_factory("hold", "600", "1.0")
    job.expect("blocked")
    os.kill(job.proc.pid, signal.SIGTERM)
    time.sleep(0.3)
    os.kill(job.proc.pid, signal.SIGTERM)  # the same notice, forwarded by a launcher
    assert job.alive_after(later_s)
    os.kill(job.proc.pid, signal.SIGTERM)  # after the window: the user wants it dead
    code, lines = job.rest(timeout=20)
    assert code == -signal.SIGTERM
    assert lines == ["release-1"]


def test_a_preemption_hold_ends_the_process_when_the_grace_period_runs_out(job_factory):
    job = job_factory("hold", "2.0", "1.0")
    job.expect("blocked")
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGTERM)
    code, lines = job.rest(timeout=30)
    assert code == -signal.SIGTERM and lines == ["release-1"]
    assert time.monotonic() - t0 >= 2.0  # not before the grace period ran out


def test_sigkill_still_ends_a_process_that_holds_sigterm(job_factory):
    job = job_factory("hold", "600", "2.0")
    job.expect("blocked")
    os.kill(job.proc.pid, signal.SIGTERM)
    os.kill(job.proc.pid, signal.SIGKILL)
    code, _ = job.rest(timeout=20)
    assert code == -signal.SIGKILL


def test_the_handler_is_installed_only_while_a_release_action_needs_it_and_sigterm_was_at_its_default():
    class Owner:
        pass

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    owner = Owner()
    release = process_hooks.release_on_termination(owner, lambda _: None)
    try:
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        release()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # nohup: SIGTERM ignored, and it stays so
    try:
        release = process_hooks.release_on_termination(owner, lambda _: None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        release()
    finally:
        signal.signal(signal.SIGTERM, previous)
