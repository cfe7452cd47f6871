"""How the cluster demo shows what it set up, its runs beside the planner, and the recoveries. Only formatting."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from rich.table import Table

from ckptio.demo.cluster.figures import RECOVERY_PHASES

if TYPE_CHECKING:
    from ckptio.demo.cluster.outcome import ClusterConfig, ClusterOutcome
    from ckptio.testing.cluster import Lab

_PLAN_MODE = {"ckptio": "ckptio", "dcp-best": "dcp_best"}


def setup_lines(lab: Lab, config: ClusterConfig) -> list[str]:
    """What the lab set up, in words."""
    pfs = type(lab.pfs).__name__ if lab.pfs is not None else "none"
    s3 = lab.s3.kind if lab.s3 is not None else "none"
    return [
        f"[bold]ckptio demo --cluster[/]: a lab of {config.nodes} node namespaces ({config.ranks_per_node} rank(s) "
        f"each, {config.ranks} in all) on a bridge, every node link shaped to {config.node_mbit:g} Mbit/s, the "
        f"store's to {config.store_mbit:g} Mbit/s (tc htb, one class per peer and direction); {pfs} mounted on "
        f"every node, S3 from {s3}, both behind the store's link; a loader on every node reading the parallel FS.",
        f"  the job: {config.state_mib:g} MiB of state per rank, a {config.grad_mib:g} MiB all-reduce across the "
        f"nodes every step, {config.calm_steps} calm steps, then a save every {config.every} steps, {config.saves} "
        f"saves; ckptio keeps a local level with a partner copy on the next node and goes durable every "
        f"{config.durable_every}th save; then node {config.lost_node} is lost (killed, its disk wiped) and the "
        "job resumes.",
        f"  lab started in {lab.timings.start_s:.1f} s (network {lab.timings.network_s:.1f}, parallel FS "
        f"{lab.timings.pfs_s:.1f}, S3 {lab.timings.s3_s:.1f}, mounts {lab.timings.mounts_s:.1f}); under {lab.dir}",
    ]


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _vs(measured: float | None, predicted: float | None) -> str:
    if measured is None:
        return "—"
    if predicted is None:
        return _s(measured)
    ratio = f" ({predicted / measured:.2f}×)" if measured > 0 else ""
    return f"{measured:.2f} s | {predicted:.2f} s{ratio}"


def _mode(plan: dict[str, Any], saver: str) -> dict[str, Any]:
    return dict(plan.get("modes", {}).get(_PLAN_MODE[saver], {}))


def train_table(outcome: ClusterOutcome) -> Table:
    table = Table(title="measured | planner (planner ÷ measured)", title_justify="left")
    for column in ("run", "lost per save", "flush (durable)", "lag max", "all-reduce calm → saving",
                   "loaders Mbit/s per node: calm → saving"):
        table.add_column(column)
    for run in outcome.runs:
        f = run.figures
        mode = _mode(run.plan, run.saver)
        slowdown = f.allreduce_slowdown
        reduce = (f"{f.allreduce_calm_s * 1e3:.0f} → {f.allreduce_saving_s * 1e3:.0f} ms (+{slowdown:.0%})"
                  if f.allreduce_saving_s is not None and slowdown is not None else "—")
        loaders = ", ".join(f"{c:.0f}→{s:.0f}" for c, s in zip(f.loader_calm_mbit, f.loader_saving_mbit, strict=True))
        table.add_row(run.name, _vs(f.lost_per_save_s, mode.get("lost_per_save_s")),
                      _vs(f.flush_s, run.plan.get("flush_s")), _s(f.lag_max_s), reduce, loaders)
    return table


def recovery_table(outcome: ClusterOutcome) -> Table:
    table = Table(title="after a node loss: kill → first resumed step (s), the slowest rank", title_justify="left")
    table.add_column("run")
    for phase in RECOVERY_PHASES:
        table.add_column(phase)
    table.add_column("total")
    table.add_column("restore: planner")
    table.add_column("bytes from")
    for run in outcome.runs:
        rec = run.recovery
        if rec is None:
            continue
        level = "partner" if run.saver == "ckptio" else "durable"
        predicted = run.plan.get("restore_s", {}).get(level)
        table.add_row(run.name, *(f"{rec.phases[p]:.2f}" for p in RECOVERY_PHASES), f"{rec.total_s:.2f}",
                      _s(predicted), ", ".join(f"{k}: {v} files" for k, v in sorted(rec.sources.items())))
    return table


def pacing_lines(outcome: ClusterOutcome) -> list[str]:
    """Per run, the CPU its saves took outside training beside the planner's charge; per ckptio run, what its
    writers applied (from their event logs): the partner copies' and the paced flushes' rates beside the pace, and
    how many paced flushes a later save hurried to full speed."""
    lines = []
    for run in outcome.runs:
        if run.cpu is not None:
            lines.append(f"  {run.name}: CPU per save per node outside training: writer {run.cpu.writer_s:.2f} s, "
                         f"FUSE client {run.cpu.client_s:.2f} s; planner's background CPU "
                         f"{_mode(run.plan, run.saver).get('background_cpu_s', float('nan')):.2f} s")
        p = run.pacing
        if p is None:
            continue
        copies = (f"partner copies {statistics.median(p.partner_bytes_per_s) / 1e6:.1f} MB/s (median of "
                  f"{len(p.partner_bytes_per_s)})" if p.partner_bytes_per_s else "no partner copies")
        flushes = (f"paced flushes {statistics.median(p.flush_achieved_bytes_per_s) / 1e6:.1f} MB/s, target "
                   f"{statistics.median(p.flush_target_bytes_per_s) / 1e6:.1f} (hurried {p.hurried} of "
                   f"{p.paced_flushes})" if p.paced_flushes else "no paced flush")
        lines.append(f"  {run.name} (every {run.every} steps): {copies}; {flushes}")
    return lines
