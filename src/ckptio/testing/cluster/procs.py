"""Processes the lab starts, each known by its pid and its start time, and stopped by them only.

Rules:
- A process is identified by (pid, start time in clock ticks from ``/proc/<pid>/stat``): a pid recycled by the
  kernel for someone else's process never matches, so the lab can never signal a process it did not start.
- Every process starts in a session of its own (``start_new_session``), so its process group id is its pid: a
  daemon's helpers (a FUSE client's threads, a server's workers) go with it when the group is signalled. The group
  is signalled only while its leader is still the process the lab started.
- Nothing is ever matched by name or command line.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


class LabError(RuntimeError):
    """A lab command failed: the message carries the command and what it printed."""


def run(argv: Sequence[str], *, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion; ``LabError`` with its output when it fails and ``check`` is set."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when no such process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2:].split()[0] == "Z"


@dataclass
class Proc:
    """One process the lab started: its identity, what it is for, and the Popen that reaps it."""

    pid: int
    started: int
    name: str
    popen: subprocess.Popen[Any] | None = None
    log: Path | None = None

    def alive(self) -> bool:
        """True while the pid still names the process the lab started (and it has not exited)."""
        if self.popen is not None and self.popen.poll() is not None:
            return False
        return start_time(self.pid) == self.started and not is_zombie(self.pid)

    def signal_group(self, sig: int) -> None:
        """Signal the process's group (its pid), only while the leader is still ours."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the process to end; True when it has."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1.0)
        return True

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` (some servers, SeaweedFS's, ignore SIGTERM)."""
        if grace_s > 0:
            self.signal_group(signal.SIGTERM)
            if self.wait(grace_s):
                return
        self.signal_group(signal.SIGKILL)
        self.wait(5.0)

    def tail(self, chars: int = 2000) -> str:
        """The end of its log, for error messages."""
        if self.log is None:
            return ""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def record(self) -> list[Any]:
        return [self.pid, self.started, self.name]


def spawn(argv: Sequence[str], *, name: str, log: Path | None = None, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None, stdout: int | IO[Any] | None = None, text: bool = False) -> Proc:
    """Start ``argv`` in a session of its own. Its stderr goes to ``log``, and its stdout too unless ``stdout`` is
    given (``subprocess.PIPE`` for a caller that reads it)."""
    handle = open(log, "ab") if log is not None else None  # noqa: SIM115 - the child holds its own copy
    try:
        popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                 stdout=stdout if stdout is not None else handle,
                                 stderr=handle if handle is not None else None,
                                 env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                                 text=text)
    except OSError as exc:
        raise LabError(f"cannot start {name} ({' '.join(argv)}): {exc}") from exc
    finally:
        if handle is not None:
            handle.close()
    started = start_time(popen.pid)
    return Proc(popen.pid, started if started is not None else -1, name, popen, log)


def private_mounts(binds: Sequence[tuple[str, Path]], argv: Sequence[str]) -> list[str]:
    """``argv`` in a mount namespace of its own, where each system directory of ``binds`` is the given lab
    directory: for daemons that hard-code paths such as ``/tmp`` or ``/var/run/gluster``. The namespace and its
    bind mounts vanish with the last process in it, never show in the host's ``/proc/mounts``, and two labs never
    share a file there. (Start such a daemon with a ``cwd`` and relative paths when a bind hides where its files
    are, as binding ``/tmp`` hides a lab under ``/tmp``.) A program under a bound directory (a venv's ``weed`` in a
    checkout under ``/tmp``) is opened before the binds and run through that descriptor, so it stays reachable; any
    other runs by its path (a Python run through a descriptor would not find its venv)."""
    steps = [f"mkdir -p {shlex.quote(system)} && mount --bind {shlex.quote(str(mine))} {shlex.quote(system)}"
             for system, mine in binds]
    for _system, mine in binds:
        mine.mkdir(parents=True, exist_ok=True)
    program = os.path.abspath(shutil.which(argv[0]) or argv[0])
    hidden = any(program.startswith(system.rstrip("/") + "/") for system, _mine in binds)
    script = " && ".join(['exec 9<"$1"', *steps, 'shift', 'exec /proc/self/fd/9 "$@"'] if hidden
                         else [*steps, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, argv[0], program, *argv[1:]]


def kill_recorded(pid: int, started: int) -> None:
    """SIGKILL the group of a process recorded by an earlier lab, only if the pid still names that process."""
    if start_time(pid) == started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def wait_until(check: Any, timeout: float, what: str, proc: Proc | None = None, interval: float = 0.05) -> None:
    """Poll ``check()`` until true; ``LabError`` naming ``what`` (and the process's log) on timeout or its exit."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if proc is not None and not proc.alive():
            raise LabError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
        if time.monotonic() >= deadline:
            tail = f":\n{proc.tail()}" if proc is not None else ""
            raise LabError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
        time.sleep(interval)
