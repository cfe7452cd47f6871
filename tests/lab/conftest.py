"""Fixtures of the cluster lab (issue 19): one shaped 2-node lab for tests/lab, roots on its parallel filesystem
and its S3, a GlusterFS lab, and two mounts of one volume on two nodes.

The lab needs root, network namespaces, FUSE and the packages ``make labdeps`` installs; where any is missing,
every lab test skips with the reason. One lab is shared by the tests of this folder, and stopped after them: each
works under a root of its own, and a test that loses a node revives it (``Lab.lose_node``), so the next test finds
the lab whole. Labs left by a run that crashed are removed first (``cleanup_stale``: only those whose owning
process is dead).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptio.testing.cluster import Lab, LabConfig, LabUnavailable, cleanup_stale
from ckptio.testing.cluster.checks import reason

JOB = str(Path(__file__).with_name("lab_job.py"))
NODE_MBIT = 400.0
STORE_MBIT = 800.0
_roots = itertools.count()


def start_lab(config: LabConfig) -> Lab:
    """A started lab, or a skip saying why this machine cannot run one."""
    try:
        lab = Lab(config)
    except LabUnavailable as exc:
        pytest.skip(f"cluster lab unavailable: {exc}")
    return lab.start()


def skip_unless_lab(config: LabConfig) -> None:
    """Skip, saying why, where a lab of this shape cannot run (without starting one)."""
    why = reason(config.pfs, config.s3)
    if why:
        pytest.skip(f"cluster lab unavailable: {why}")


@pytest.fixture(scope="package")
def session_lab() -> Iterator[Lab]:
    """One lab for every test of tests/lab, stopped after the last of them (package scope: the rest of the suite
    does not run beside its idle daemons)."""
    try:
        cleanup_stale()
    except Exception:  # a machine without ip netns: start_lab says why below
        pass
    lab = start_lab(LabConfig(nodes=2, node_mbit=NODE_MBIT, store_mbit=STORE_MBIT))
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def lab(session_lab: Lab) -> Lab:
    """The session's lab, checked whole: every node's mount up, every daemon running."""
    dead = [p.name for p in session_lab.res.daemons if not p.alive()]
    assert not dead, f"lab daemons died: {dead}"
    for node in session_lab.nodes:
        assert node.mount.is_dir(), f"{node.name}'s mount is gone"
    return session_lab


def fresh_name(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name.replace('[', '-').replace(']', '')[:60]}-{next(_roots)}"


@pytest.fixture
def pfs_root(lab: Lab, request: pytest.FixtureRequest) -> Path:
    """An empty directory on the parallel filesystem, as node 0 mounts it (the same path under
    ``lab.nodes[i].mount`` is the same directory seen by node i)."""
    root = lab.nodes[0].mount / "tests" / fresh_name(request)
    root.mkdir(parents=True)
    return root


@pytest.fixture(scope="module")
def gluster_lab() -> Iterator[Lab]:
    """A 2-node lab serving GlusterFS (a 2-brick distributed volume) instead of MooseFS, no S3; one per module."""
    lab = start_lab(LabConfig(nodes=2, node_mbit=NODE_MBIT, store_mbit=STORE_MBIT, pfs="glusterfs", s3="none"))
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture(params=["moosefs", "glusterfs"])
def pfs_lab(request: pytest.FixtureRequest) -> Lab:
    """The session's MooseFS lab, then the module's GlusterFS lab: a test using it runs on both filesystems."""
    lab: Lab = request.getfixturevalue("lab" if request.param == "moosefs" else "gluster_lab")
    return lab


@dataclass(frozen=True)
class TwoMounts:
    """One directory of one volume, as two clients on two nodes see it (a bind mount would be one client)."""

    lab: Lab
    first: Path  # through node 0's client, as this (host) process names it
    second: Path  # the same directory through node 1's client
    shared: Path  # the name a process launched on either node gives it (under ``lab.pfs_path``)


@pytest.fixture
def two_mounts(pfs_lab: Lab, request: pytest.FixtureRequest) -> TwoMounts:
    """A fresh directory seen through two mounts on two nodes, on MooseFS and on GlusterFS (issue 20's
    cross-client tests: two processes on two mounts)."""
    relative = Path("two-mounts") / fresh_name(request)
    (pfs_lab.nodes[0].mount / relative).mkdir(parents=True)
    return TwoMounts(pfs_lab, pfs_lab.nodes[0].mount / relative, pfs_lab.nodes[1].mount / relative,
                     pfs_lab.pfs_path / relative)


@pytest.fixture
def lab_s3_env(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> str:
    """The lab's S3 for this (host) process and what it spawns: AWS_* set to its credentials and its loopback
    forwarder (which crosses node 0's shaped link). Returns the bucket."""
    if lab.s3 is None or lab.s3.host_url is None:
        pytest.skip("the lab has no S3")
    for key, value in lab.s3.env(lab.s3.host_url).items():
        monkeypatch.setenv(key, value)
    return lab.s3.bucket


def python() -> str:
    return sys.executable
