"""The lab leaves nothing behind: after a test that failed inside it, after a start that failed halfway, and after
its owner was killed (``cleanup_stale``). Nothing means: none of its namespaces in ``ip netns list``, none of its
mounts in /proc/mounts, none of the processes it started (by pid and start time), and not its directory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ckptio.testing.cluster import Lab, LabConfig, LabError, cleanup_stale, netns
from ckptio.testing.cluster.moosefs import MooseFS
from ckptio.testing.cluster.procs import is_zombie, start_time
from ckptio.testing.cluster.resources import mount_points
from tests.lab.conftest import skip_unless_lab, start_lab

pytestmark = pytest.mark.lab


def _snapshot(lab: Lab) -> dict[str, list]:
    return {"namespaces": list(lab.res.namespaces), "mounts": [str(n.mount) for n in lab.nodes],
            "procs": [[p.pid, p.started, p.name] for p in lab.procs()], "dir": [str(lab.dir)]}


def _assert_gone(seen: dict[str, list]) -> None:
    assert seen["namespaces"] and seen["procs"], seen  # the lab did make things
    assert not set(seen["namespaces"]) & set(netns.listed())
    directory = seen["dir"][0]
    assert not [m for m in mount_points() if m.startswith(directory)]
    alive = [name for pid, started, name in seen["procs"] if start_time(pid) == started and not is_zombie(pid)]
    assert not alive, alive
    assert not Path(directory).exists()


def test_a_failure_inside_the_lab_leaves_nothing_behind() -> None:
    lab = start_lab(LabConfig(nodes=1))
    with pytest.raises(RuntimeError, match="the test failed"), lab:
        lab.launch(0, [sys.executable, "-c", "import time; time.sleep(600)"])  # a job still running
        (lab.nodes[0].mount / "open").write_bytes(b"x")
        held = open(lab.nodes[0].mount / "open", "rb")  # noqa: SIM115 - a file held open on the mount
        seen = _snapshot(lab)
        assert any(p.name.startswith("mfs") for p in lab.procs()) and any(p.name == "weed" for p in lab.procs())
        raise RuntimeError("the test failed")
    with contextlib.suppress(OSError):  # ENOTCONN: its mount was detached (lazily: it was busy) and its client stopped
        held.close()
    _assert_gone(seen)
    lab.close()  # idempotent: nothing left to remove, no error


def test_a_start_that_fails_halfway_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list] = {}
    real_start = MooseFS._start_chunkserver

    def fail_on_the_second(self: MooseFS, index: int, port: int, master: object) -> object:
        if index == 1:
            seen.update(_snapshot_of(self))
            raise LabError("chunkserver 1 did not start")
        return real_start(self, index, port, master)  # type: ignore[arg-type]

    def _snapshot_of(pfs: MooseFS) -> dict[str, list]:
        return {"namespaces": list(pfs.res.namespaces), "mounts": [],
                "procs": [[p.pid, p.started, p.name] for p in pfs.res.daemons], "dir": [str(pfs.res.dir)]}

    monkeypatch.setattr(MooseFS, "_start_chunkserver", fail_on_the_second)
    with pytest.raises(LabError, match="chunkserver 1 did not start"):
        start_lab(LabConfig(nodes=1, s3="none"))
    _assert_gone(seen)


OWNER = """
import json, sys, time
from ckptio.testing.cluster import Lab, LabConfig
lab = Lab(LabConfig(nodes=1, s3="none")).start()
print(json.dumps({"namespaces": lab.res.namespaces, "mounts": [str(n.mount) for n in lab.nodes],
                  "procs": [[p.pid, p.started, p.name] for p in lab.procs()], "dir": [str(lab.dir)]}), flush=True)
time.sleep(600)
"""


def test_cleanup_stale_removes_what_a_killed_owner_left() -> None:
    skip_unless_lab(LabConfig(nodes=1, s3="none"))
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        seen = json.loads(owner.stdout.readline())
    finally:
        os.kill(owner.pid, signal.SIGKILL)  # no teardown runs: everything it made is left
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    assert set(seen["namespaces"]) <= set(netns.listed())
    removed = cleanup_stale()
    assert f"removed stale lab {Path(seen['dir'][0]).name}" in removed
    _assert_gone(seen)
