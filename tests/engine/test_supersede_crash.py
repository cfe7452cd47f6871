"""Issue 21 item 2: a supersede is crash-atomic on both levels. Step 1 is committed, then saved again; the job
(trainer and writer: one process group) is killed -9 at each point of the supersede in turn (the writer stops
there through the test-only ``CKPTIO_TEST_PAUSE`` hook of ``engine.writer.commit_point``). A fresh job's restore
then always finds step 1, in the old state or the new one, bit-exact: the old one until the new ``.metadata`` is
in place, the new one from then on. The restore runs before any writer could repair the step."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

import ckptio
from ckptio.format import committed_steps
from ckptio.format.local_level_records import local_records
from ckptio.storage import open_storage
from ckptio.testing.ranks import ScriptProcess, start_script
from tests.engine.supersede_job import job_options, state_for

JOB = os.path.join(os.path.dirname(__file__), "supersede_job.py")
pytestmark = [pytest.mark.slow]

# Each point of the supersede, and the state a restore finds after a kill there.
POINTS = [("begun", "A"), ("recorded", "A"), ("metadata", "B"), ("manifest", "B"), ("done", "B")]


def _run(tmp_path: Path, level: str, env: dict[str, str]) -> ScriptProcess:
    # Forked from the rank fork server (no torch import per job); a session of its own for killpg.
    return start_script(JOB, [str(tmp_path), level], env={**os.environ, **env}, new_session=True)


@pytest.mark.parametrize("level", ["durable", "local"])
@pytest.mark.parametrize(("point", "expected"), POINTS)
def test_a_kill_at_each_point_of_a_supersede_leaves_the_old_or_the_new_step(tmp_path, level, point, expected):
    paused = tmp_path / "paused"
    paused.mkdir()
    job = _run(tmp_path, level, {"CKPTIO_TEST_PAUSE": f"{level}:{point}:{paused}"})
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
    # A fresh job restores (in this process; no writer: the interrupted supersede is still as the kill left it,
    # which is what a reader must cope with; tests/engine/writer/test_supersede.py holds the next writer's repair).
    options = job_options(tmp_path, level)
    with ckptio.Checkpointer(str(tmp_path / "root"), start_writer="on_first_save", **options) as ck:
        target = {"w": torch.zeros_like(state_for("A")["w"]), "step": -1}
        assert ck.restore(target) == 1
        assert ck.last_restore.level == level
    variant = next((v for v in "AB" if torch.equal(target["w"], state_for(v)["w"])), "neither")
    assert variant == expected, point
