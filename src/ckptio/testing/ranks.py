"""Launch real torch.distributed gloo ranks on 127.0.0.1 for multi-rank tests (shared by every test folder)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
from collections.abc import Callable, Sequence
from typing import IO, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ckptio.testing.fork_server import fork_context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def take_environment(env: dict[str, str]) -> None:
    """Make this process's environment ``env`` (the starting process's, passed with the rank's arguments)."""
    os.environ.clear()
    os.environ.update(env)


_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, str]]
"""A rank's function, its arguments after (rank, world_size), and the starting process's environment."""


def _entry(rank: int, world_size: int, port: int, job: _Job) -> None:
    fn, args, env = job
    take_environment(env)
    # The variables torchrun would set: stacks (Lightning, Accelerate) read them, not only init_process_group.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
        # Every rank is done before any tears its groups down: a gloo rank that closes its sockets while a peer's
        # I/O threads still use them can abort that peer (seen as SIGABRT/SIGBUS at exit in 4-rank tests).
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_quietly()


def _exit_quietly(code: int = 0) -> None:
    """End a rank that succeeded (or a script, with its exit ``code``) without the interpreter's finalization.

    With torch 2.13 a rank whose work and teardown completed still died now and then with "terminate called without
    an active exception" (SIGABRT; the message of a native thread object destroyed while joinable, which points at
    finalization: no trace was caught), failing the test after everything it checks was done. The rank's own exit
    work still runs: atexit handlers (ckptio unlinks its /dev/shm staging slots there) and flushing the standard
    streams. A rank that failed raises instead, so the spawner reports its traceback as before.
    """
    import atexit
    import sys

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_ranks(world_size: int, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks forked from the kit's fork server
    (:func:`~ckptio.testing.fork_server.fork_context`: no rank imports torch again); re-raises a rank's failure.
    Each rank takes the starting process's environment (:func:`take_environment`: the server's is that of its own
    start), then makes its process group."""
    fork_context()  # torch's start_processes takes a method name: this sets the fork server's preload list
    mp.start_processes(_entry, args=(world_size, free_port(), (fn, args, dict(os.environ))), nprocs=world_size,
                       join=True, start_method="forkserver")


class ScriptProcess:
    """A script started by :func:`start_script`: the parts of ``subprocess.Popen`` tests use (``pid``, ``stdout``,
    ``poll``, ``wait``, ``returncode``: negative for the signal that ended it, as ``Popen`` says it)."""

    def __init__(self, process: Any, stdout: IO[str]) -> None:
        self._process, self.stdout = process, stdout

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    @property
    def returncode(self) -> int | None:
        code = self._process.exitcode
        return None if code is None else int(code)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self.returncode
        if code is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout or 0.0)
        return code


def start_script(path: str, args: Sequence[str], *, env: dict[str, str], new_session: bool = False) -> ScriptProcess:
    """Run ``python path *args`` as a process forked from the kit's fork server
    (:func:`~ckptio.testing.fork_server.fork_context`), its standard output a pipe the caller reads (``.stdout``,
    text), in a session of its own when ``new_session`` (so that ``os.killpg(pid)`` ends it with every process it
    started, as ``start_new_session`` does).

    The script runs as ``__main__`` with ``sys.argv`` and the first ``sys.path`` entry a plain run gives it, in
    ``env``; it ends as :func:`_exit_quietly` ends a rank: its exit code (an exception: 1, its traceback on standard
    error) after the ``atexit`` handlers and flushing the streams, without the interpreter's finalization."""
    read, write = multiprocessing.Pipe(duplex=False)
    process = fork_context().Process(
        target=_script_entry, args=((path, tuple(args), env, new_session), write), name=os.path.basename(path))
    process.start()
    write.close()
    stdout = os.fdopen(os.dup(read.fileno()), "r")
    read.close()
    return ScriptProcess(process, stdout)


def _script_entry(script: tuple[str, tuple[str, ...], dict[str, str], bool], out: Any) -> None:
    import runpy
    import sys
    import traceback

    path, args, env, new_session = script
    if new_session:
        os.setsid()
    take_environment(env)
    os.dup2(out.fileno(), 1)
    out.close()
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's stdout until it ends
    sys.argv, sys.path[0] = [path, *args], os.path.dirname(os.path.abspath(path))
    code = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    _exit_quietly(code)
