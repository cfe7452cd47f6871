"""The shared process helpers: a pid check that tells a dead process from a live one, SIGTERM as Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from ckptio._proc import pid_alive, sigterm_as_interrupt


def test_pid_alive_tells_live_from_dead() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid no longer names a process
    assert not pid_alive(child.pid)


def test_sigterm_raises_keyboard_interrupt_inside_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_as_interrupt_is_a_no_op_off_the_main_thread() -> None:
    entered: list[bool] = []

    def body() -> None:
        with sigterm_as_interrupt():
            entered.append(True)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert entered == [True]
