"""Jobs across the lab's nodes: a two-node save and restore over the fabric, a node lost and restored from its
partner, loaders reading the store across their links.

Every rank runs in its own node's namespace: gloo, the partner copies and the store's traffic cross the shaped
links. Every rank is given the same root (``lab.pfs_path``: each node's own mount of the one volume).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptio.testing.cluster import Lab, netns
from ckptio.testing.cluster.jobs import RankJob, read_loader, write_dataset

pytestmark = pytest.mark.lab

HERE = Path(__file__).parent
JOB = str(HERE / "lab_job.py")


def run_job(lab: Lab, spec: dict[str, Any], nodes: list[int]) -> RankJob:
    return lab.launch_ranks([sys.executable, JOB, json.dumps(spec)], nodes)


def test_two_nodes_save_then_restore_bit_exact_over_the_fabric(lab: Lab, pfs_root: Path) -> None:
    root = str(lab.pfs_path / pfs_root.relative_to(lab.nodes[0].mount))
    first = run_job(lab, {"root": root, "local": None, "steps": 3, "mode": "exit"}, [0, 1])
    assert [first.line(r, "done")["done"] for r in (0, 1)] == [3, 3]
    assert first.wait() == [0, 0]
    # Both nodes' writes landed on the one volume: node 1's mount lists what node 0's does.
    names = {p.name for p in pfs_root.rglob("*")}
    assert names == {p.name for p in (lab.nodes[1].mount / pfs_root.relative_to(lab.nodes[0].mount)).rglob("*")}
    second = run_job(lab, {"root": root, "local": None, "steps": 0, "mode": "exit"}, [1, 0])  # ranks swap nodes
    for rank in (0, 1):
        line = second.line(rank, "restored")
        assert line["restored"] == 3 and line["ok"], line
        assert line["last_restore"]["level"] == "durable", line
    assert second.wait() == [0, 0]


def test_a_lost_node_restores_from_its_partner(lab: Lab, pfs_root: Path) -> None:
    """Two levels (``durable_every=2``, ``replicas=1``): steps 1..5 on the local level, 2 and 4 durable. Node 1
    is lost for real (every process in its namespace killed, its local disk wiped) after step 5; on restart its
    rank restores step 5, newer than any durable step, entirely from the partner copy on node 0."""
    spec = {"root": str(lab.pfs_path / pfs_root.relative_to(lab.nodes[0].mount)), "local": str(lab.local_path),
            "durable_every": 2, "replicas": 1, "lease_s": 0}
    job = run_job(lab, {**spec, "steps": 5, "mode": "hang"}, [0, 1])
    assert [job.line(r, "done")["done"] for r in (0, 1)] == [5, 5]
    lab.lose_node(1)
    assert netns.pids(lab.nodes[1].ns) == [lab.pfs.clients[str(lab.nodes[1].mount)].pid]  # only its new client
    assert not any(lab.nodes[1].local.iterdir())
    job.kill()  # the launcher tears down the rest of the job
    again = run_job(lab, {**spec, "steps": 0, "mode": "exit"}, [0, 1])
    lines = [again.line(r, "restored") for r in (0, 1)]
    assert again.wait() == [0, 0]
    for line in lines:
        assert line["restored"] == 5 and line["ok"], line
        assert line["last_restore"]["level"] == "local", line
    # Node 0 pushed rank 1's file back over the fabric while the step was being chosen; rank 1 read it from there.
    # Rank 0 read its own file from its disk (a range of rank 1's file it needs too may come from rank 1).
    assert "local" in lines[0]["last_restore"]["sources"], lines[0]
    assert set(lines[1]["last_restore"]["sources"]) == {"partner"}, lines[1]
    pushed = [p.name for p in (lab.nodes[1].local / "partners" / "step-00000005").iterdir()]  # its disk was wiped
    assert len(pushed) == 1 and pushed[0].startswith("__1_"), pushed


def test_loaders_read_the_store_across_their_links(lab: Lab, pfs_root: Path) -> None:
    """A loader per node reads the data set again and again; every byte it counts crossed its node's link (the
    bridge port's shaped egress counted at least as many): the page cache does not serve it."""
    write_dataset(pfs_root / "data", files=2, size=4 << 20)
    before = [sum(netns.class_bytes(lab.fabric, n.port).values()) for n in lab.nodes]
    outs = [lab.dir / f"loader-{pfs_root.name}-{n.index}.jsonl" for n in lab.nodes]
    loaders = [lab.start_loader(n.index, lab.pfs_path / pfs_root.relative_to(lab.nodes[0].mount) / "data", out,
                                interval_s=0.2) for n, out in zip(lab.nodes, outs, strict=True)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(sum(s["bytes"] for s in read_loader(o)) > 24 << 20 for o in outs):
        time.sleep(0.2)
    for proc in loaders:
        proc.stop(0.0)
    after = [sum(netns.class_bytes(lab.fabric, n.port).values()) for n in lab.nodes]
    for node, out in enumerate(outs):
        read = sum(s["bytes"] for s in read_loader(out))
        assert read > 24 << 20, f"node {node}'s loader read {read} bytes"  # three passes over the 8 MiB set
        assert after[node] - before[node] >= read, (node, read, after[node] - before[node])
