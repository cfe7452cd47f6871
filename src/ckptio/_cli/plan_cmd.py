"""``ckptio plan``: the burst budget of a job on a store, as a table and a verdict (or ``--json``).

Owns the command's flags (contract, see ``ckptio plan --help``) and its human output. It must never measure
storage: a profile comes from ``ckptio probe``.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from ckptio._cli.job_args import Job, add_job_arguments, add_storage_arguments, job_from_args
from ckptio.plan.budget import BurstBudget, plan_burst
from ckptio.plan.units import format_bytes, format_duration, format_rate

_VERDICT_STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="burst budget of a job's checkpoints on a store",
        description="Size one checkpoint of the job and its burst on the store: blocking, flush, "
        "whether the flush keeps up, overhead, Young/Daly intervals. Exit 0, or 2 for bad arguments.",
    )
    add_job_arguments(parser)
    add_storage_arguments(parser)
    parser.add_argument("--mode", choices=("async", "sync"), default="async", help="how the job saves")
    parser.add_argument("--json", action="store_true", help="print the budget as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    job = job_from_args(args, mode=args.mode)
    budget = plan_burst(job.shape, job.storage, job.schedule)
    if args.json:
        print(json.dumps(budget.to_json(), indent=2))
    else:
        print_budget(Console(file=sys.stdout), job, budget)
    return 0


def print_budget(console: Console, job: Job, b: BurstBudget) -> None:
    """The budget as a rich table followed by the verdict paragraph."""
    table = Table(title="ckptio plan", show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column(justify="right")
    table.add_column(style="dim")
    par = job.model.parallelism
    rows = [
        ("model", f"{b.params / 1e9:,.2f} B params", f"{job.model.weights_dtype} + {job.model.optimizer}"),
        ("ranks", f"{b.ranks:,}", f"TP {par.tp} × PP {par.pp} × DP {par.dp}, ZeRO-{par.zero}"),
        ("checkpoint", format_bytes(b.checkpoint_bytes), f"{b.objects_per_checkpoint:,} objects"),
        ("largest rank", format_bytes(b.bytes_per_rank_max), f"{len(job.shape.classes)} rank classes"),
        ("store", format_rate(job.storage.write_bytes_per_s), _store_note(job)),
        ("blocking (async)", format_duration(b.blocking_s), "device-to-host copy of the largest rank"),
        ("sync stall", format_duration(b.sync_stall_s), "copy + flush, training waits"),
        ("flush", format_duration(b.flush_s), f"limited by {b.bottleneck}"),
        ("interval", format_duration(b.interval_s), _interval_note(b)),
        ("keeps up", "yes" if b.keeps_up else "NO", f"flush takes {b.flush_s / b.interval_s:.0%} of it"),
        ("overhead", f"{b.overhead_fraction:.2%}", f"{format_duration(b.stall_s_per_checkpoint)} per save"),
        ("Young / Daly", f"{format_duration(b.young_interval_s)} / {format_duration(b.optimal_interval_s)}",
         f"δ {format_duration(b.checkpoint_cost_s)}, MTBF {format_duration(b.mtbf_s)}"),
        ("lost per failure", format_duration(b.expected_lost_work_s), "back to the newest committed save"),
        ("GPU-hours lost/day", f"{b.gpu_hours_lost_per_day:,.1f}", f"{b.waste_fraction:.2%} of the job"),
    ]
    if b.restore_s is not None:
        rows.append(("restore", format_duration(b.restore_s), "all ranks reading at once"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print()
    style = _VERDICT_STYLE[b.verdict]
    console.print(f"[{style}]verdict: {b.verdict}[/]  {verdict_paragraph(b)}", highlight=False)


def _store_note(job: Job) -> str:
    st = job.storage
    parts: list[str] = [st.kind]
    if st.per_writer_bytes_per_s != float("inf"):
        parts.append(f"{format_rate(st.per_writer_bytes_per_s)} per writer")
    if st.metadata_ops_per_s and st.kind == "posix":
        parts.append(f"{st.metadata_ops_per_s:,.0f} metadata ops/s")
    if st.kind == "object":
        parts.append(f"{st.request_rate_limit:,.0f} PUT/s over {st.prefixes} prefix(es)")
    if st.serialize_bytes_per_s != float("inf"):
        parts.append(f"serialize {format_rate(st.serialize_bytes_per_s)} per writer")
    return ", ".join(parts)


def _interval_note(b: BurstBudget) -> str:
    steps = f"{b.interval_steps:,} steps" if b.interval_steps else ""
    source = "Daly's optimum (no --interval)" if b.interval_source == "daly" else "given"
    return ", ".join(p for p in (steps, source) if p)


def verdict_paragraph(b: BurstBudget) -> str:
    """A few sentences: what the numbers mean and what to change."""
    if b.verdict == "ok":
        return (
            f"The store takes the burst: each save blocks training {format_duration(b.blocking_s)} and its "
            f"flush ends {format_duration(b.interval_s - b.flush_s)} before the next save."
        )
    return " ".join(f"{reason[0].upper()}{reason[1:]}." for reason in b.reasons)
