"""Starts the ranks of one demo run, watches them, and leaves no process behind.

Each rank runs ``python -m ckptio.demo.rank`` in a session of its own, so a Ctrl-C reaches only the
launcher, which then ends every rank's whole process group (the rank and whatever it started: ckptio's
writer processes, DCP's threads die with their rank). The rendezvous is a TCPStore the launcher binds on
127.0.0.1 port 0, so two demos never race for a port. This module must never interpret results: it returns
what the ranks wrote."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO

import torch.distributed as dist

from ckptio.demo.job import RankJob, RankResult
from ckptio.errors import CkptError

_POLL_S = 0.1
_TERM_GRACE_S = 3.0


def _tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def _rank_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # gloo must listen on loopback: the demo is one machine, and the host name may resolve to nothing useful.
    if os.path.exists("/sys/class/net/lo"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # DCP's checkpoint process (DCP-best) rendezvouses at MASTER_ADDR, else at this host's resolved name.
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class RankGroup:
    """The processes of one run; ``terminate`` ends every process group they lead."""

    def __init__(self, job_path: str, world: int, log_dir: str, label: str) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.log_paths = [os.path.join(log_dir, f"{label}.rank{rank}.log") for rank in range(world)]
        env = _rank_env()
        for rank, log_path in enumerate(self.log_paths):
            log = open(log_path, "wb")  # noqa: SIM115 (closed in terminate)
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ckptio.demo.rank", job_path, str(rank)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            )

    def failed(self) -> tuple[int, int] | None:
        """(rank, exit code) of the first rank that exited with an error, if any."""
        for rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code not in (None, 0):
                return rank, code
        return None

    def finished(self) -> bool:
        return all(proc.poll() == 0 for proc in self.procs)

    def terminate(self) -> None:
        """SIGTERM every rank's process group, SIGKILL what is left after a grace period. Idempotent."""
        self._signal_groups(signal.SIGTERM, only_running=True)
        deadline = time.monotonic() + _TERM_GRACE_S
        while time.monotonic() < deadline and any(proc.poll() is None for proc in self.procs):
            time.sleep(_POLL_S)
        # Children of a rank (writer processes) may outlive it: end the whole group, leader gone or not.
        self._signal_groups(signal.SIGKILL, only_running=False)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_TERM_GRACE_S)
        for log in self.logs:
            log.close()

    def _signal_groups(self, signum: signal.Signals, *, only_running: bool) -> None:
        for proc in self.procs:
            if only_running and proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signum)


@contextlib.contextmanager
def _rendezvous() -> Iterator[dist.TCPStore]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        yield store
    finally:
        del store


def run_ranks(
    job: RankJob,
    *,
    work_dir: str,
    on_step: Callable[[str, int], None] | None = None,
    timeout_s: float = 600.0,
) -> dict[str, list[RankResult]]:
    """Run ``job`` on ``job.world`` fresh processes; every rank's result, or an error with a log tail."""
    for folder in (job.events_dir, job.results_dir, os.path.join(work_dir, "logs")):
        os.makedirs(folder, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(job.progress_path)
    with _rendezvous() as store:
        job.store_port = store.port
        label = "-".join(job.runs)
        job_path = os.path.join(work_dir, f"{label}.job.json")
        job.dump(job_path)
        group = RankGroup(job_path, job.world, os.path.join(work_dir, "logs"), label)
        try:
            _watch(group, job, on_step, timeout_s)
        finally:
            group.terminate()
    return {run: [RankResult.load(job.result_path(run, rank)) for rank in range(job.world)] for run in job.runs}


def _watch(group: RankGroup, job: RankJob, on_step: Callable[[str, int], None] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not group.finished():
        failure = group.failed()
        if failure is not None:
            rank, code = failure
            log = group.log_paths[rank]
            raise CkptError(f"demo rank {rank} exited with {code}; log {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise CkptError(f"demo ranks took longer than {timeout_s:.0f} s; logs in {group.log_paths}")
        if on_step is not None:
            progress = _read_progress(job.progress_path)
            if progress is not None:
                on_step(*progress)
        time.sleep(_POLL_S)


def _read_progress(path: str) -> tuple[str, int] | None:
    """(run, step) that rank 0 last reported."""
    try:
        with open(path) as f:
            run, _, step = f.read().strip().partition(" ")
    except OSError:
        return None
    return (run, int(step)) if step.isdigit() else None
