"""``ckptio simulate``: the job of ``ckptio plan`` run save by save on a fluid model of the store.

Owns the command's flags (those of ``plan`` plus the simulation's), its table, ``--json``, ``--events`` (the
simulation in ckptio's event schema) and ``--out`` (the timeline picture, drawn by ``ckptio.obs.report``).
The model is :mod:`ckptio.plan.simulation.burst`'s.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from ckptio._cli.failures import add_failure_arguments, failure_args, failures_table, inject_failures
from ckptio._cli.job_args import (
    Job,
    add_job_arguments,
    add_storage_arguments,
    int_flag,
    job_from_args,
    rate_flag,
    size_flag,
)
from ckptio._cli.level_args import MAX_RANKS_PER_NODE
from ckptio._cli.pace_args import add_pace_arguments, flush_pace
from ckptio._cli.paths import check_output, writing
from ckptio.plan.simulation.burst import SimulationConfig, SimulationResult, simulate
from ckptio.plan.simulation.burst_types import MAX_CHECKPOINTS
from ckptio.plan.simulation.simulation_events import simulation_events, write_events
from ckptio.plan.units import format_bytes, format_duration, format_rate

_SHOWN_RECORDS = 12


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        usage="ckptio simulate [options]  (ckptio simulate --help lists them)",
        help="simulate the job's saves on a model of the store: stalls, flush lag, skips, idle GPUs",
        description="Run --checkpoints saves of the job through a fluid model of ranks, writers, queues and "
        "a shared store (max-min fair bandwidth, per-writer caps, request limits, data-loader reads).",
    )
    add_job_arguments(parser)
    add_storage_arguments(parser)
    sim = parser.add_argument_group("simulation")
    sim.add_argument("--checkpoints", type=int, default=20,
                     help=f"save requests to simulate (20; at most {MAX_CHECKPOINTS:,})")
    sim.add_argument("--mode", choices=("sync", "async", "tiered"), default="async", help="how saves run")
    sim.add_argument("--max-pending", type=int, default=1, help="staging slots per rank (1)")
    sim.add_argument("--overflow", choices=("block", "skip"), default="block", help="no free slot: (block)")
    sim.add_argument(
        "--loader-read-bandwidth", default="0", help="aggregate data-loader reads from the store"
    )
    sim.add_argument("--local-bandwidth", help="tiered: one node's local tier write bandwidth")
    sim.add_argument("--local-capacity", help="tiered: one node's local tier capacity")
    sim.add_argument("--ranks-per-node", type=int, default=8, help="ranks sharing a local tier (8)")
    add_pace_arguments(parser)
    add_failure_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the result as JSON (with per-save records)")
    out.add_argument("--events", help="write the simulation as ckptio JSONL events (for `ckptio report`)")
    out.add_argument("--out", help="draw the timeline: FILE.png or FILE.html (needs matplotlib)")
    parser.set_defaults(func=run)


MAX_PENDING = 1000
"""Staging slots per rank: each holds a whole copy of the rank's state; no host has room for more."""


def simulation_config(args: argparse.Namespace) -> SimulationConfig:
    local_bw, local_cap = args.local_bandwidth, args.local_capacity
    pace = flush_pace(args)
    return SimulationConfig(
        checkpoints=int_flag(args.checkpoints, "--checkpoints", low=1, high=MAX_CHECKPOINTS),
        mode=args.mode,
        max_pending=int_flag(args.max_pending, "--max-pending", low=1, high=MAX_PENDING),
        overflow=args.overflow,
        loader_read_bytes_per_s=rate_flag(args.loader_read_bandwidth, "--loader-read-bandwidth", zero=True),
        local_bytes_per_s=rate_flag(local_bw, "--local-bandwidth") if local_bw else None,
        local_capacity_bytes=size_flag(local_cap, "--local-capacity") if local_cap else None,
        ranks_per_node=int_flag(args.ranks_per_node, "--ranks-per-node", low=1, high=MAX_RANKS_PER_NODE),
        pace=pace if pace.pace is not None else None,
    )


def run(args: argparse.Namespace) -> int:
    config = simulation_config(args)
    counts = failure_args(args)
    check_output(args.events, "--events")
    check_output(args.out, "--out")
    # The planner's schedule semantics: a synchronous simulation is planned as a synchronous job.
    job = job_from_args(args, mode="sync" if config.mode == "sync" else "async")
    result = simulate(job.shape, job.storage, job.schedule, config)
    failures = inject_failures(args, job, counts)
    if args.events or args.out:
        records = simulation_events(result, job.shape, step_time_s=job.schedule.step_time_s)
        if args.events:
            with writing(args.events, "--events"):
                write_events(records, args.events)
        if args.out:
            from ckptio.obs.report import write_report

            with writing(args.out, "--out"):
                write_report(records, args.out, title=f"ckptio simulate: {result.ranks:,} ranks, {config.mode}")
    if args.json:
        print(json.dumps({**result.to_json(), **({"failures": failures} if failures else {})}, indent=2))
    else:
        print_result(Console(file=sys.stdout), job, result, config)
        if failures:
            Console(file=sys.stdout).print(failures_table(failures))
        for path in (args.events, args.out):
            if path:
                print(f"written: {path}")
    return 0


def print_result(console: Console, job: Job, r: SimulationResult, config: SimulationConfig) -> None:
    summary = Table(title=f"ckptio simulate ({r.mode})", show_header=False, title_justify="left", box=None)
    summary.add_column(style="dim")
    summary.add_column(justify="right")
    summary.add_column(style="dim")
    rows = [
        ("ranks", f"{r.ranks:,}", f"{r.rank_classes} classes, {format_bytes(job.shape.total_bytes)} a save"),
        (
            "saves",
            f"{r.checkpoints:,}",
            f"every {format_duration(r.interval_s)} of compute, {r.skipped} skipped",
        ),
        (
            "flush",
            format_duration(r.flush_s),
            f"max {format_duration(r.flush_s_max)}; plan: {format_duration(r.plan_flush_s)}",
        ),
        (
            "stall per save",
            format_duration(r.stall_s_per_checkpoint),
            f"copy {format_duration(r.blocking_s)}",
        ),
        (
            "lag growth",
            f"{r.lag_growth_s_per_checkpoint:+,.1f} s/save",
            f"queue depth up to {r.queue_depth_max}",
        ),
        ("GPU idle", f"{r.gpu_idle_fraction:.2%}", f"{r.gpu_idle_hours_per_day:,.1f} GPU-hours/day"),
        ("loader slowdown", f"{r.loader_slowdown_fraction:.2%}", "compute lost to the flush's reads share"),
        ("store", f"{r.storage_utilization:.1%} utilized", f"busy {r.store_busy_fraction:.1%} of the time"),
        ("store peak", format_rate(r.peak_store_demand_bytes_per_s),
         "writers at once" + (f", flush_pace={config.pace.label()}" if config.pace else "")),
        ("host staging", format_bytes(r.host_staging_bytes_per_rank), "peak per rank"),
    ]
    for row in rows:
        summary.add_row(*row)
    console.print(summary)
    console.print(_records_table(r))
    verdict = "keeps up" if r.keeps_up else "does NOT keep up"
    style = "bold green" if r.keeps_up else "bold red"
    console.print(f"[{style}]{verdict}[/]", highlight=False)


def _records_table(r: SimulationResult) -> Table:
    table = Table(title="saves", title_justify="left")
    for name in ("#", "at", "queue", "stall", "flush", "lag"):
        table.add_column(name, justify="right")
    shown = r.records if len(r.records) <= _SHOWN_RECORDS else r.records[:6] + r.records[-6:]
    for rec in shown:
        if rec.skipped:
            at = format_duration(rec.requested_s)
            table.add_row(str(rec.index), at, str(rec.queue_depth), "skipped", "", "")
            continue
        flush = format_duration(rec.flush_s) if rec.flush_s is not None else "-"
        lag = format_duration(rec.lag_s) if rec.lag_s is not None else "-"
        table.add_row(
            str(rec.index),
            format_duration(rec.requested_s),
            str(rec.queue_depth),
            format_duration(rec.stall_s),
            flush,
            lag,
        )
    return table
