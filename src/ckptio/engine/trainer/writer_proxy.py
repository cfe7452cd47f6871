"""The trainer's side of its writer process: start, feed, listen, notice death, restart.

One reader thread per rank blocks on the pipe (releasing the GIL while idle) and dispatches the writer's messages;
when the pipe closes without a ``stop`` the writer died (kill -9, OOM killer, a crash in a C extension) and the
proxy reports it once. The proxy never decides anything about steps: the Checkpointer does, in the foreground.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ckptio._proc import child_env
from ckptio._wait import bounded
from ckptio.engine.protocol import (
    FromWriter,
    SaveJob,
    SaveRelease,
    SaveReserve,
    ToWriter,
    WriterHurry,
    WriterPlan,
    WriterStart,
    WriterStop,
    WriterStopped,
)


def _launch(start: WriterStart) -> tuple[subprocess.Popen[bytes], Connection]:
    """A fresh interpreter (never fork: torch's thread pools and CUDA contexts do not survive it), wired by a
    socketpair; the writer gets ``start`` as its first message."""
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptio.engine.writer", str(theirs.fileno()), str(start.config.writer_nice)],
            # The partner server's listening socket, held by the trainer, is inherited by each writer (its address
            # outlives a writer restart).
            pass_fds=[theirs.fileno()] + ([start.levels.listen_fd] if start.levels is not None else []),
            env=child_env(),  # the writer must import the same ckptio as the trainer, installed or not
            close_fds=True,
        )
    except BaseException:
        ours.close()  # no writer: a failed start leaves no socket behind
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    conn.send(start)
    return proc, conn


class WriterProxy:
    """Owns one writer process at a time; ``start`` again after a death gives a fresh one."""

    def __init__(
        self,
        start: WriterStart,
        *,
        on_message: Callable[[FromWriter], None],
        on_death: Callable[[int | None], None],
    ) -> None:
        self.start_message = start
        self._on_message = on_message
        self._on_death = on_death
        self._proc: Any = None
        self._conn: Any = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._send_lock = threading.Lock()
        self._plan: WriterPlan | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        proc, parent = _launch(self.start_message)
        self._proc, self._conn, self._stopping = proc, parent, False
        self._reader = threading.Thread(
            target=self._read_loop, args=(proc, parent), name="ckptio-writer-reader", daemon=True
        )
        self._reader.start()
        if self._plan is not None:  # a restarted writer needs the current plan again
            self._send(self._plan)

    def ensure_started(self) -> None:
        if self._proc is None:
            self.start()

    def send_plan(self, plan: WriterPlan) -> None:
        self._plan = plan
        self._send(plan)

    def submit(self, job: SaveJob) -> None:
        self._send(job)

    def reserve(self, step: int) -> None:
        self._send(SaveReserve(step))

    def release(self, step: int) -> None:
        self._send(SaveRelease(step))

    def hurry(self) -> None:
        """The flush in progress (if paced) goes to full speed."""
        if self._proc is not None:
            self._send(WriterHurry())

    def _send(self, msg: ToWriter) -> None:
        with self._send_lock:
            try:
                self._conn.send(msg)
            except (BrokenPipeError, OSError):
                pass  # the reader thread reports the death

    def _read_loop(self, proc: Any, conn: Any) -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            match msg:
                case WriterStopped():
                    break
                case _:
                    self._on_message(msg)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not self._stopping:
            self._on_death(proc.returncode)

    def stop(self, timeout: float = 30.0) -> bool:
        """Ask the writer to finish its queue and exit; kill it if it has not within ``timeout`` seconds (a stuck
        or stopped writer never makes this hang). True when it stopped by itself."""
        if self._proc is None:
            return True
        proc = self._proc
        self._stopping = True
        self._send(WriterStop())
        if self._reader is not None:
            self._reader.join(bounded(timeout))
        try:
            proc.wait(timeout=0 if self._reader is not None and self._reader.is_alive() else 5)
            clean = True
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGKILL ends a SIGSTOPped process too
            proc.wait()
            clean = False
        if self._reader is not None:
            self._reader.join(5)  # the pipe closed with the process
        self._conn.close()
        self._proc = None
        return clean

    def forget(self) -> None:
        """After a death: drop the dead process so the next ``ensure_started`` starts a new one."""
        self._proc = None
