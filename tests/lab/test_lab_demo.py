"""The cluster demo's pieces on the shared lab (issue 19): its job across two nodes with ckptio's two levels, a node
lost for real, the resume's breakdown, and the planner's probe from inside the nodes.

One short job (a few MiB per rank) keeps this within the lab tests' budget; the full run is ``make lab``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptio.demo.cluster import planner
from ckptio.demo.cluster.figures import RECOVERY_PHASES, recovery_figures, train_figures
from ckptio.demo.cluster.outcome import ClusterConfig
from ckptio.demo.cluster.runner import durable_steps, spec_for
from ckptio.demo.cluster.session import LabSession
from ckptio.testing.cluster import Lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def test_the_demo_job_loses_a_node_and_resumes_from_local_and_partner(lab: Lab, pfs_root: Path) -> None:
    session = LabSession.on(lab)
    config = ClusterConfig(nodes=2, state_mib=2.0, grad_mib=0.5, every=3, saves=2, calm_steps=4, paced_run=False)
    root = str(lab.pfs_path / pfs_root.relative_to(lab.nodes[0].mount))
    local = str(lab.local_path / pfs_root.name)
    spec = spec_for(config, "ckptio", root, local, hang=True)
    run, job = session.run_job(spec, [0, 1], 1)
    figures = train_figures(run.records, [], every=config.every, durable=durable_steps(config))
    assert figures.saves == config.saves and figures.flush_s is not None and figures.flush_s > 0
    assert figures.allreduce_calm_s > 0  # the all-reduce crossed the fabric every step
    resumed = session.lose_and_resume(job, {**spec, "phase": "resume", "hang": False}, 1, [0, 1], 1)
    rec = recovery_figures(resumed.killed, resumed.relaunched, resumed.ranks)
    assert rec.restored_step == config.every * config.saves, resumed.ranks  # the newest, local-only save
    assert rec.level == "local" and rec.sources.get("partner"), rec  # the lost node's shard came over the fabric
    # The survivor's own shard is on its own node: nothing of it crosses the fabric (its state's names are its own,
    # not replicated ones DCP's planner would save once and send every rank).
    survivor = resumed.ranks[0]  # rank 0, on node 0
    assert survivor["sources"] == {"local": survivor["sources"].get("local")} and survivor["sources"]["local"], survivor
    assert list(rec.phases) == list(RECOVERY_PHASES)
    assert sum(rec.phases.values()) == pytest.approx(rec.total_s)


def test_the_planner_probes_the_store_from_inside_every_node(lab: Lab, tmp_path: Path) -> None:
    """Probes on both nodes at once: their sum is the job's aggregate, which the store's link bounds."""
    figures = planner.probe_store(LabSession.on(lab), [0, 1], "pfs", tmp_path, ranks_per_node=1,
                                  file_size="4MiB", seconds=12.0)
    store_link = lab.config.store_mbit * 1e6 / 8
    assert 0 < figures.write_bytes_per_s <= store_link * 1.1, figures  # htb's small burst allowance
    assert len(figures.per_node_write) == 2 and figures.profile.exists()
