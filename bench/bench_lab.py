"""The cluster lab's figures (issue 19): the main job at cluster shape, the fabric, recovery, the planner's matrix.

Run as root where the lab runs (``make lab`` installs its packages first): ``python bench/bench_lab.py``
(``--no-matrix``: the demo's runs only). Prints, in one run:

1. ``ckptio demo --cluster``'s tables: ckptio (local level, partner copy, every 2nd save durable) and DCP-best on the
   parallel FS, ckptio paced (``partner_pace``, ``flush_pace="auto"``), ckptio on S3; each beside ``ckptio plan``'s
   prediction from ``ckptio probe`` run inside the nodes; a node lost and the job resumed, with the breakdown;
2. the planner's matrix (store link × node count × interval, one interval the store cannot keep up with):
   predicted ÷ measured flush, lost per save and ``restore_s``, and ``admit``'s verdict in each;
3. ``RATIOS planner_worst=… admit_right=R/T recovery_vs_dcp_best=… allreduce_slowdown_vs_dcp_best=…``: the planner
   ratio farthest from 1 across the matrix, the configurations where ``admit`` was right, ckptio's restore phase ÷
   DCP-best's, and paced ckptio's all-reduce slowdown ÷ DCP-best's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ckptio.demo.cluster import matrix, planner
from ckptio.demo.cluster.outcome import ClusterConfig, ClusterOutcome
from ckptio.demo.cluster.runner import run_cluster_demo
from ckptio.demo.cluster.session import LabSession
from ckptio.testing.cluster import LabUnavailable


def run_matrix(console: Console, session: LabSession, out: Path, state_mib: float,
               probes: dict[tuple[float, int], planner.StoreFigures]) -> list[matrix.PointResult]:
    """The matrix on the demo's lab (its shape: 4 nodes at 400 Mbit; each point reshapes the store's link and
    uses the first ``nodes`` nodes). ``probes``: store figures already measured, by (store Mbit, nodes)."""
    results: list[matrix.PointResult] = []
    for points in matrix.by_link(matrix.DEFAULT_POINTS):
        console.print(f"[dim]· matrix: {'; '.join(p.label() for p in points)} …[/]")
        results += matrix.run_link(session, points, state_mib=state_mib, grad_mib=2.0, saves=3, out=out,
                                   probes=probes)
    return results


def matrix_table(results: list[matrix.PointResult]) -> Table:
    table = Table(title="the planner held to the lab: measured | planner (planner ÷ measured)", title_justify="left")
    for column in ("configuration", "interval", "flush", "lost per save", "restore_s", "admit", "store link ÷ ckpt"):
        table.add_column(column)
    for r in results:

        def cell(measured: float | None, predicted: float | None, name: str, r: matrix.PointResult = r) -> str:
            if measured is None or predicted is None:
                return "—"
            ratio, mark = r.ratios()[name], "" if r.holds()[name] else " ✗"
            return f"{measured:.2f} | {predicted:.2f} s ({ratio:.2f}×){mark}" if ratio else f"{measured:.2f} | —"

        verdict = "admit" if r.admitted else "refuse: " + "; ".join(r.reasons)[:80]
        table.add_row(r.point.label(), f"{r.every} steps, {r.every * r.figures.clean_step_s:.1f} s",
                      cell(r.figures.flush_s, r.planned_flush_s(), "flush"),
                      cell(r.figures.lost_per_save_s, r.plan["modes"]["ckptio"]["lost_per_save_s"], "lost"),
                      cell(r.restore_s, r.plan["restore_s"].get("durable"), "restore"),
                      verdict + ("" if r.admit_right else " ✗"),
                      f"{r.carried.written_share:.2f}" if r.carried else "—")
    return table


def ratios_line(outcome: ClusterOutcome, results: list[matrix.PointResult]) -> str:
    ck, dcp, paced = (outcome.run(n) for n in ("ckptio on the parallel FS", "DCP-best on the parallel FS",
                                               "ckptio paced on the parallel FS"))
    recovery = None
    if ck and dcp and ck.recovery and dcp.recovery and dcp.recovery.phases["restore"] > 0:
        recovery = ck.recovery.phases["restore"] / dcp.recovery.phases["restore"]
    fabric = None
    slow_dcp = dcp.figures.allreduce_slowdown if dcp else None
    slow_paced = paced.figures.allreduce_slowdown if paced else None
    if slow_dcp and slow_paced is not None and slow_dcp > 0:
        fabric = slow_paced / slow_dcp
    worst = matrix.worst_ratio(results) if results else None
    right = sum(r.admit_right for r in results)

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    return (f"RATIOS planner_worst={fmt(worst)} admit_right={right}/{len(results)} "
            f"recovery_vs_dcp_best={fmt(recovery)} allreduce_slowdown_vs_dcp_best={fmt(fabric)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-matrix", action="store_true", help="the demo's runs only")
    parser.add_argument("--out", default="ckptio-lab-bench", help="where the probes' profiles go")
    parser.add_argument("--state-mib", type=float, default=16.0, help="checkpointed MiB per rank (16)")
    args = parser.parse_args()
    console = Console(width=150)
    began = time.monotonic()
    config = ClusterConfig(out=Path(args.out), state_mib=args.state_mib)
    try:
        # One lab for the demo and the matrix: the matrix's shape is the demo's, and the demo's probe of the
        # parallel FS at the full store link on all nodes is the matrix's probe for that configuration.
        with LabSession(config.lab(), loaders=False) as session:
            outcome = run_cluster_demo(config, console, session)
            probes = {(config.store_mbit, config.nodes): outcome.stores["pfs"]} if config.ranks_per_node == 1 else {}
            results = [] if args.no_matrix else run_matrix(console, session, Path(args.out), args.state_mib, probes)
    except LabUnavailable as exc:
        print(f"bench_lab: the cluster lab cannot run here: {exc}", file=sys.stderr)
        return 1
    if results:
        console.print(matrix_table(results))
    console.print(f"bench_lab finished in {time.monotonic() - began:.0f} s")
    print(ratios_line(outcome, results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
