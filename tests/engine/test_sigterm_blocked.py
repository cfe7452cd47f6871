"""SIGTERM while the main thread waits in native code (issue 21, item 5): a rank blocked in a gloo collective for
a stopped peer (in ``restore``, or in the barrier of a planning ``save``) never runs a Python-level handler, yet it
must die of SIGTERM as the README promises: at once with one level; with two levels at a SIGTERM after the duplicate
window, or when the grace period runs out.

Real gloo ranks as separate processes (``two_level_job.py``), a real SIGSTOP of the peer, real SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.engine.test_two_levels import NODES2, Job

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

CASES = [
    # (where rank 0 waits, durable_every, SIGTERMs and the pause after each, grace)
    ("blocked-restore", 1, [0.0], 600.0),  # one level: the first SIGTERM ends it
    ("blocked-restore", 2, [3.0, 0.0], 600.0),  # two levels: the second, after the 2 s duplicate window
    ("blocked-save", 2, [0.0], 3.0),  # two levels: the grace period runs out
]


@pytest.mark.parametrize(("mode", "durable_every", "pauses", "grace"), CASES,
                         ids=["restore-one-level", "restore-two-levels-second-sigterm", "save-two-levels-grace"])
def test_a_rank_blocked_in_a_collective_dies_of_sigterm(tmp_path, mode, durable_every, pauses, grace):
    job = Job(tmp_path, NODES2, mode, durable_every=durable_every, grace=grace)
    try:
        job.line(1, "stopping")
        job.line(0, "waiting")
        time.sleep(1.0)  # rank 0 is inside the collective by now
        t0 = time.monotonic()
        for pause in pauses:
            os.kill(job.procs[0].pid, signal.SIGTERM)
            time.sleep(pause)
        assert job.procs[0].wait(timeout=30) == -signal.SIGTERM
        assert time.monotonic() - t0 < 30
    finally:
        for proc in job.procs:  # rank 1 is stopped: SIGKILL reaches it anyway
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        job.wait(timeout=60)
