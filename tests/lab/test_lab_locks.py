"""What a lock excludes across two clients of one parallel filesystem: the evidence for issue 20.

ckptio's POSIX compare-and-swap serializes with ``flock`` on a directory. Two processes on one node (one FUSE
client) are excluded; two processes on two nodes (two clients of the same volume) are not, on MooseFS and on
GlusterFS: nothing stops two nodes committing to one root at once. A POSIX record lock (``lockf``) on a regular
file is honoured across clients on both. Each case runs real processes in the nodes' namespaces.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptio.testing.cluster import Lab
from ckptio.testing.cluster.jobs import RankJob
from tests.lab.conftest import TwoMounts

pytestmark = pytest.mark.lab

LOCK = str(Path(__file__).with_name("lock_probe.py"))


def test_two_mounts_are_two_clients_of_one_volume(two_mounts: TwoMounts) -> None:
    assert os.stat(two_mounts.first).st_dev != os.stat(two_mounts.second).st_dev  # two mounts, not one
    (two_mounts.first / "written-by-node0").write_bytes(b"from node 0")
    assert (two_mounts.second / "written-by-node0").read_bytes() == b"from node 0"  # one volume


def _probe(lab: Lab, node: int, kind: str, path: Path, mode: str) -> tuple[RankJob, dict[str, Any]]:
    proc = lab.launch(node, [sys.executable, LOCK, kind, str(path), mode], stdout=subprocess.PIPE)
    lines = RankJob([proc], [node])
    return lines, lines.line(0, "held" if mode == "hold" else "acquired", timeout=60)


@pytest.mark.parametrize(("kind", "same_node", "exclusive"), [
    ("flock-dir", True, True),  # one client: the kernel excludes the second taker
    ("flock-dir", False, False),  # two clients: not excluded, so ckptio's POSIX CAS must change (issue 20)
    ("lockf-file", False, True),  # a POSIX record lock on a file is honoured across clients
])
def test_what_a_lock_excludes_across_two_mounts(two_mounts: TwoMounts, kind: str, same_node: bool,
                                                 exclusive: bool) -> None:
    lab = two_mounts.lab
    # Each process sees its own node's client at lab.pfs_path: the same path names the same directory on both
    # nodes, through two different clients.
    target = two_mounts.shared / "lock" if kind == "lockf-file" else two_mounts.shared
    holder, held = _probe(lab, 0, kind, target, "hold")
    try:
        assert held == {"held": True}
        _, tried = _probe(lab, 0 if same_node else 1, kind, target, "try")
        assert tried == {"acquired": not exclusive}
    finally:
        holder.kill()
