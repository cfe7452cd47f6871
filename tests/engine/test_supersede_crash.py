"""Issue 21 item 2: a supersede is crash-atomic on both levels. Step 1 is committed, then saved again; the job
(trainer and writer: one process group) is killed -9 at each point of the supersede in turn (the writer stops
there through the test-only ``CKPTIO_TEST_PAUSE`` hook of ``engine.writer.commit_point``). A fresh job's restore
then always finds step 1, in the old state or the new one, bit-exact: the old one until the new ``.metadata`` is
in place, the new one from then on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptio.format import committed_steps, read_manifest
from ckptio.format.local_level import local_records
from ckptio.storage import open_storage

JOB = os.path.join(os.path.dirname(__file__), "supersede_job.py")
pytestmark = [pytest.mark.slow]

# Each point of the supersede, and the state a restore finds after a kill there.
POINTS = [("begun", "A"), ("recorded", "A"), ("metadata", "B"), ("manifest", "B"), ("done", "B")]


def _run(tmp_path: Path, level: str, mode: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, JOB, str(tmp_path / "root"), str(tmp_path / "local"), level, mode],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            start_new_session=True)


@pytest.mark.parametrize("level", ["durable", "local"])
@pytest.mark.parametrize(("point", "expected"), POINTS)
def test_a_kill_at_each_point_of_a_supersede_leaves_the_old_or_the_new_step(tmp_path, level, point, expected):
    paused = tmp_path / "paused"
    paused.mkdir()
    job = _run(tmp_path, level, "save", {"CKPTIO_TEST_PAUSE": f"{level}:{point}:{paused}"})
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "saved A"
        deadline = time.monotonic() + 120
        while not (paused / point).exists():
            assert job.poll() is None and time.monotonic() < deadline, f"the writer never reached {point!r}"
            time.sleep(0.05)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # trainer and writer at once
        job.wait()
        if job.stdout is not None:
            job.stdout.close()
    records = open_storage(str(tmp_path / "root"))
    records = local_records(records) if level == "local" else records
    assert committed_steps(records) == [1]  # never without a manifest, at any point
    assert read_manifest(records, 1).save_id > 0

    again = _run(tmp_path, level, "restore")
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"restored": 1, "variant": expected, "level": level}, (point, result)
    # The restoring job's writer finished the interrupted supersede: one manifest, no pending record left.
    deadline = time.monotonic() + 30
    while records.exists("step-00000001/supersede.json") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not records.exists("step-00000001/supersede.json")
