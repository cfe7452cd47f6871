"""``ckptio demo --cluster``: the main job at cluster shape in the lab, ckptio against DCP-best, beside the planner.

Phases, each announced: the lab (what it set up), the probes (``ckptio probe`` inside every node, against the
parallel filesystem and S3), then per run — ckptio on the parallel FS, DCP-best on the parallel FS, ckptio on S3 —
a calm phase and the saves, with a loader reading on every node; after the two parallel-FS runs a node is lost for
real and the job resumes (ckptio from its local level and the partner copy, DCP-best from the durable store). Each
run's figures are printed beside ``ckptio plan``'s prediction for it. DCP-best runs on the parallel FS only: torch
ships no S3 writer of its own (its fsspec writer needs s3fs, which ckptio does not depend on).

This module sequences and prints; the ranks measure (:mod:`~ckptio.demo.cluster.lab_rank`), the figures are
:mod:`~ckptio.demo.cluster.figures`', the predictions :mod:`~ckptio.demo.cluster.planner`'s.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from ckptio.demo.cluster import planner
from ckptio.demo.cluster.cpu import save_cpu
from ckptio.demo.cluster.figures import calm_span, pacing_figures, recovery_figures, saving_span, train_figures
from ckptio.demo.cluster.matrix import STEP_GUESS_S
from ckptio.demo.cluster.outcome import ClusterConfig, ClusterOutcome, RunOutcome
from ckptio.demo.cluster.session import LabSession
from ckptio.demo.cluster.table import pacing_lines, recovery_table, setup_lines, train_table
from ckptio.obs.events import rank_path


def spec_for(config: ClusterConfig, saver: str, root: str, local: str | None, *, hang: bool,
             paced: bool = False, events: str | None = None) -> dict[str, Any]:
    """What every rank of a run is told (``lab_rank``'s SPEC). The lab's S3 has no public-access API: it is
    declared private, as an on-prem store would be. ``events``: ckptio's per-rank event logs (the paces the
    writers applied are read back from them)."""
    options: dict[str, Any] = {"keep_last": 2, "volume_check": "off", "lease_s": 0, "partner_timeout_s": 30.0,
                               "commit_timeout_s": 120, "store_private": root.startswith("s3://")}
    if local is not None:
        options.update(local_dir=local, durable_every=config.durable_every, replicas=1)
    if events is not None:
        options.update(events_path=events)
    if paced:
        options.update(partner_pace=config.pace_bytes_per_s, flush_pace=config.pace_bytes_per_s)
    return {"phase": "train", "saver": saver, "root": root, "state_mib": config.state_mib,
            "grad_mib": config.grad_mib, "every": config.every, "steps": config.every * config.saves,
            "calm_steps": config.calm_steps, "hang": hang, "options": options}


def durable_steps(config: ClusterConfig) -> set[int]:
    """The steps of ckptio's saves that go durable: the k-th call of ``save`` and every k-th after it (the first,
    untimed save at step 0 is the first call)."""
    return {n * config.every for n in range(1, config.saves + 1) if (n + 1) % config.durable_every == 0}


def run_cluster_demo(config: ClusterConfig, console: Console | None = None,
                     session: LabSession | None = None) -> ClusterOutcome:
    """Run the whole cluster demo; raises LabUnavailable where the lab cannot run. ``session``: a lab already
    started with ``config.lab()``'s shape (the bench goes on with its matrix there); else one of its own."""
    console = console or Console(width=140)
    if session is None:
        with LabSession(config.lab(), loaders=False) as own:
            return run_cluster_demo(config, console, own)
    began = time.monotonic()
    config.out.mkdir(parents=True, exist_ok=True)
    for line in setup_lines(session.lab, config):
        console.print(line)
    nodes = list(range(config.nodes))
    stores = {}
    for store in config.stores:
        console.print(f"[dim]· ckptio probe on {config.nodes} nodes at once against the {store} …[/]")
        stores[store] = planner.probe_store(session, nodes, store, config.out, ranks_per_node=config.ranks_per_node)
    outcome = ClusterOutcome(config, [], stores)
    session.start_loaders()  # after the probes: they measure the store the job gets when the loaders idle
    try:
        local_rate = planner.probe_local(session.lab.dir / "probe-local", config.out / "probe-local.json")
        for name, saver, store in _runs(config):
            console.print(f"[dim]· {name} …[/]")
            run_config = config
            if saver.endswith("-paced"):
                step_s = outcome.runs[0].figures.clean_step_s if outcome.runs else STEP_GUESS_S
                run_config = replace(config, every=config.paced_every(step_s))
            outcome.runs.append(run_one(session, run_config, name, saver.removesuffix("-paced"), store,
                                        figures=stores[store], local_rate=local_rate, paced=saver.endswith("-paced")))
    finally:
        session.stop_loaders()
    outcome.wall_s = time.monotonic() - began
    console.print(train_table(outcome))
    for line in pacing_lines(outcome):
        console.print(line)
    console.print(recovery_table(outcome))
    console.print(f"cluster demo finished in {outcome.wall_s:.0f} s")
    return outcome


def _runs(config: ClusterConfig) -> list[tuple[str, str, str]]:
    runs = [("ckptio on the parallel FS", "ckptio", "pfs"), ("DCP-best on the parallel FS", "dcp-best", "pfs")]
    if config.paced_run:
        runs.append(("ckptio paced on the parallel FS", "ckptio-paced", "pfs"))
    if "s3" in config.stores:
        runs.append(("ckptio on S3", "ckptio", "s3"))
    return [r for r in runs if r[2] in config.stores]


def run_one(session: LabSession, config: ClusterConfig, name: str, saver: str, store: str, *,
            figures: planner.StoreFigures, local_rate: float, paced: bool = False) -> RunOutcome:
    """One run; unpaced on the parallel FS it ends with a node loss and a resume."""
    tag = f"{saver}-{store}-{time.monotonic_ns()}"
    root = session.pfs_root(tag)[0] if store == "pfs" else session.s3_root(tag)
    local = str(session.lab.local_path / tag) if saver == "ckptio" else None
    lose = store == "pfs" and not paced
    events = config.out.resolve() / f"events-{tag}.jsonl" if saver == "ckptio" else None  # kept for a look after
    spec = spec_for(config, saver, root, local, hang=lose, paced=paced, events=None if events is None else str(events))
    nodes, rpn = list(range(config.nodes)), config.ranks_per_node
    run, job = session.run_job(spec, nodes, rpn)
    durable = durable_steps(config) if saver == "ckptio" else None
    result = train_figures(run.records, session.loader_samples(), every=config.every, durable=durable)
    pacing = pacing_figures(read_events(events, config.ranks)) if events is not None else None
    cpu = save_cpu(run.cpu, calm=calm_span(run.records), saving=saving_span(run.records), saves=result.saves,
                   nodes=config.nodes)
    recovery = None
    if lose:
        resumed = session.lose_and_resume(job, {**spec, "phase": "resume", "hang": False}, config.lost_node, nodes, rpn)
        recovery = recovery_figures(resumed.killed, resumed.relaunched, resumed.ranks)
    job_shape = planner.JobShape(
        ranks=config.ranks, ranks_per_node=rpn, state_bytes_per_rank=config.state_mib * 2**20,
        step_time_s=result.clean_step_s, every=config.every,
        durable_every=config.durable_every if saver == "ckptio" else 1,
        network_bytes_per_s=config.node_mbit * 1e6 / 8, local_bytes_per_s=local_rate,
        grad_bytes=config.grad_mib * 2**20)
    return RunOutcome(name, saver, store, result, planner.plan(job_shape, figures), recovery, pacing, config.every,
                      cpu)


def read_events(path: Path, ranks: int) -> list[dict[str, Any]]:
    """Every rank's event records of a run (``events_path`` is per rank: :func:`ckptio.obs.events.rank_path`)."""
    records = []
    for rank in range(ranks):
        file = Path(rank_path(str(path), rank))
        if file.exists():
            records += [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    return records
