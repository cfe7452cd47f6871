"""Small process helpers shared by the engine, the planner, the demo and the CLI: is a pid alive, SIGTERM as
Ctrl-C, a background process's lower priority, and the environment of a fresh interpreter that imports ckptio.

Standard library only, so any layer may import it (``storage/`` judges a lock's holder with it). Must never
start, wait for or kill a process: callers own their processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["child_env", "lower_priority", "machine_id", "pid_alive", "sigterm_as_interrupt"]


def child_env() -> dict[str, str]:
    """This process's environment for a fresh interpreter (``python -m ckptio...``) that must import the same
    ckptio as this one, installed or not: ``PYTHONPATH`` is this interpreter's ``sys.path``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def lower_priority(nice: int) -> None:
    """Lower this process's priority by ``nice`` and its I/O to best-effort's lowest level (ckptio's writer):
    training wins the CPU and the disk queue, and a flush is never starved (not the idle class). Best-effort:
    ionice is Linux-only and may be refused in a container."""
    if nice <= 0:
        return
    os.nice(nice)
    with contextlib.suppress(Exception):
        import psutil

        psutil.Process().ionice(psutil.IOPRIO_CLASS_BE, value=7)


def machine_id() -> str:
    """Where this process's pid means something: the kernel's boot id and the pid namespace. Two processes with one
    machine id see each other's pids (:func:`pid_alive` answers for both); a hostname does not say so (containers
    and cloned nodes share names, and a rebooted host reuses pids). Empty where /proc cannot tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A SIGTERM inside the block raises KeyboardInterrupt, so it cleans up the way Ctrl-C does.

    Signal handlers can only be set from the main thread; elsewhere the block runs with SIGTERM left alone.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
