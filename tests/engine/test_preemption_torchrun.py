"""Preemption as launchers deliver it (issue 24): a real ``torchrun`` launch of two gloo workers, each its own "node"
of a two-level job (``node_id``, its own ``local_dir``), training with ``maybe_save`` and ``preempt_grace_s=20``.

* Slurm signals every process of the job step: SIGTERM to ``torchrun`` and to both workers at once, and then
  ``torchrun`` forwards the SIGTERM it got to each worker. Each worker sees the same preemption twice.
* ``torchrun`` alone gets SIGTERM (a container's PID 1, a user's ``kill``) and forwards it.

Each time both workers make the emergency save, exit 0 (so before the grace period ran out: past it they die of
SIGTERM), and a relaunch restores the emergency step from the local level bit-exact (``two_level_job.py`` checks
every value).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptio.format import committed_steps
from ckptio.format.local_level_records import local_records
from ckptio.storage import open_storage
from ckptio.testing.ranks import free_port
from tests.engine.test_two_levels import NODES2, Job

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

WORKER = os.path.join(os.path.dirname(__file__), "two_level_job.py")
GRACE_S = 20.0
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"


class Torchrun:
    """``torchrun --standalone --nproc-per-node 2`` of ``two_level_job.py`` in sigterm mode; the workers' JSON lines
    come through torchrun's stdout (they inherit it)."""

    def __init__(self, base: Path) -> None:
        spec = {"root": str(base / "root"), "local_base": str(base / "local"), "mode": "sigterm", "steps": 0,
                "durable_every": 1000, "grace": GRACE_S}
        env = dict(os.environ, CKPTIO_PARTNER_HOST="127.0.0.1")
        self.stderr = open(base / "torchrun.stderr", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [TORCHRUN, "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-endpoint",
             f"127.0.0.1:{free_port()}", WORKER, json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env, start_new_session=True)
        self.records: list[dict[str, Any]] = []

    def until(self, done: Any, timeout: float = 240.0) -> None:
        """Read records until ``done(records)``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while not done(self.records):
            assert time.monotonic() < deadline, f"timed out; records so far: {self.records[-6:]}"
            raw = self.proc.stdout.readline()
            assert raw, f"torchrun ended ({self.proc.wait()}) early; records: {self.records[-6:]}"
            if raw.startswith("{"):
                self.records.append(json.loads(raw))

    def of(self, rank: int, key: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("rank") == rank and key in r]

    def close(self, worker_pids: list[int]) -> None:
        for pid in [self.proc.pid, *worker_pids]:  # workers run in sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


@pytest.mark.parametrize("receivers", ["torchrun-and-workers", "torchrun-only"])
def test_an_emergency_save_survives_the_launchers_duplicated_sigterm(tmp_path, receivers):
    run = Torchrun(tmp_path)
    pids: list[int] = []
    try:
        run.until(lambda _: all(len(run.of(r, "saved")) >= 3 for r in range(2)))
        pids = [run.of(r, "pid")[0]["pid"] for r in range(2)]
        targets = [run.proc.pid] + (pids if receivers == "torchrun-and-workers" else [])
        for pid in targets:  # as Slurm does: every process of the step, at once
            os.kill(pid, signal.SIGTERM)
        run.until(lambda _: all(run.of(r, "exited") for r in range(2)), timeout=GRACE_S + 30)
        exits = [run.of(r, "exited")[0] for r in range(2)]
        assert [e["exited"] for e in exits] == [0, 0], exits  # exited cleanly, before the grace period ran out
        run.proc.communicate(timeout=60)  # torchrun ends once its workers did
    finally:
        run.close(pids)
    emergency = exits[0]["at_step"]
    assert exits[1]["at_step"] == emergency  # the same step on every rank, agreed by maybe_save
    assert committed_steps(local_records(open_storage(str(tmp_path / "root"))))[-1] == emergency
    relaunch = Job(tmp_path, NODES2, "exit")  # two_level_job.py compares every restored value with the saved state
    lines = [relaunch.line(r, "restored") for r in range(2)]
    assert relaunch.wait() == [0, 0]
    for line in lines:
        assert line["restored"] == emergency and line["ok"] and line["last_restore"]["level"] == "local", line
