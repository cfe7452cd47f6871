"""``ckptio plan``: the burst budget of a job on a store, as a table and a verdict (or ``--json``).

Owns the command's flags (contract, see ``ckptio plan --help``) and its human output. Without a store (no
``--profile``, no ``--write-bandwidth``) it prints the store-free sizing plan, verdict ``unknown``. It must never
measure storage: a profile comes from ``ckptio probe``.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from ckptio._cli.job_args import (
    MAX_KEEP_LAST,
    Job,
    add_job_arguments,
    add_storage_arguments,
    checkpoint_model,
    int_flag,
    job_from_args,
    schedule,
)
from ckptio._cli.level_args import LevelArgs, add_level_arguments, level_args
from ckptio._cli.pace_args import add_pace_arguments, flush_pace, pace_rows, recommendation, store_share
from ckptio.errors import ConfigError
from ckptio.format.commit_ops import commit_ops
from ckptio.plan.costs.background import MODES
from ckptio.plan.costs.budget import BurstBudget, plan_burst
from ckptio.plan.costs.commit_metadata import commit_shape
from ckptio.plan.costs.inputs import Host
from ckptio.plan.costs.multilevel import Loss, TwoLevelPlan, plan_two_levels
from ckptio.plan.costs.pace import PacePlan, plan_pace
from ckptio.plan.costs.sizing import SizingPlan, plan_sizes
from ckptio.plan.job.checkpoint import CheckpointShape, CheckpointSpec, shape_checkpoint
from ckptio.plan.units import check_range, format_bytes, format_duration, format_rate, quoted

_VERDICT_STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red", "unknown": "bold"}
_MODE_LABELS = {"dcp_sync": "dcp.save", "dcp_async": "dcp.async_save", "dcp_best": "DCP best", "ckptio": "ckptio"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        usage="ckptio plan [options]  (ckptio plan --help lists them)",
        help="burst budget of a job's checkpoints on a store",
        description="Size one checkpoint of the job and its burst on the store: blocking, flush, "
        "whether the flush keeps up, overhead, Young/Daly intervals, each save mode's cost to the step, "
        "restore time per level; with --local-bandwidth, the optimal local and durable intervals of two levels "
        "and the GPU-hours lost per day against one level. Without a store: sizes and intervals, verdict "
        "unknown. Exit 0, or 2 for bad arguments.",
    )
    add_job_arguments(parser)
    add_storage_arguments(parser)
    host = parser.add_argument_group("host (the background writer's cost to the step)")
    host.add_argument("--cores-per-rank", default="8", help="CPU cores of a node ÷ ranks on it (8)")
    host.add_argument("--train-cores", default="1",
                      help="cores training keeps busy per rank (1: a GPU job's Python thread)")
    add_level_arguments(parser)
    add_pace_arguments(parser, store_share=True)
    parser.add_argument("--mode", choices=("async", "sync"), default="async", help="how the job saves")
    parser.add_argument("--keep-last", default="3",
                        help="committed checkpoints kept (3): retention's deletes are part of every commit")
    parser.add_argument("--json", action="store_true", help="print the budget as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    host = Host(cores_per_rank=_cores(args.cores_per_rank, "--cores-per-rank"),
                     train_cores=_cores(args.train_cores, "--train-cores"))
    keep_last = int_flag(args.keep_last, "--keep-last", low=0, high=MAX_KEEP_LAST)
    if not args.profile and not args.write_bandwidth:
        model = checkpoint_model(args)
        plan = schedule(args, mode=args.mode)
        levels = level_args(args, step_time_s=plan.step_time_s)
        shape = shape_checkpoint(model)
        sizing = plan_sizes(shape, plan)
        given = flush_pace(args)  # the pace flags are checked without a store too
        echo = {"flush_pace": given.pace, "flush_pace_fraction": given.fraction, "store_share": store_share(args)}
        if args.json:
            ops = commit_ops(commit_shape(shape, keep_last=keep_last))  # counts need no store; their time does
            metadata = {"metadata_ops": {"per_save": ops.per_save, "per_commit": ops.per_commit}}
            print(json.dumps({**sizing.to_json(), **_store_free_levels(shape, levels), **_STORE_FREE_PACE, **echo,
                              **metadata}, indent=2))
        else:
            print_sizing(Console(file=sys.stdout), model, sizing)
        return 0
    job = job_from_args(args, mode=args.mode)
    levels = level_args(args, step_time_s=job.schedule.step_time_s)
    budget = plan_burst(job.shape, job.storage, job.schedule, host=host, network=levels.network,
                        keep_last=keep_last)
    two = plan_two_levels(job.shape, job.storage, job.schedule, budget, local=levels.local,
                          ranks_per_node=levels.ranks_per_node, node_mtbf_s=levels.node_mtbf_s,
                          job_loss_mtbf_s=levels.job_loss_mtbf_s, durable_share=levels.durable_share,
                          local_interval_s=levels.local_every_s, durable_every=levels.durable_every,
                          network=levels.network)
    pace = plan_pace(job.shape, job.storage, budget, flush_pace(args), store_share=store_share(args))
    if args.json:
        print(json.dumps({**budget.to_json(), **pace.to_json(), **two.to_json()}, indent=2))
    else:
        console = Console(file=sys.stdout)
        print_budget(console, job, budget, pace)
        console.print()
        console.print(levels_table(two))
    return 0


_STORE_FREE_PACE = dict.fromkeys(
    ("peak_demand_bytes_per_s", "paced_demand_bytes_per_s", "auto_demand_bytes_per_s", "unpaced_lag_s",
     "paced_lag_s", "paced_expected_lost_work_s", "store_share_bytes_per_s", "recommended_flush_pace"))
"""The pace keys without a store: each needs the store's bandwidth or the flush."""


def _store_free_levels(shape: CheckpointShape, levels: LevelArgs) -> dict[str, object]:
    """The two-level keys without a store: local and partner restore times when the local level is given; what
    needs the durable flush is null."""
    local = levels.local
    return {
        "lost_gpu_hours_per_day_single": None, "lost_gpu_hours_per_day_two_level": None,
        "local_interval_s": None, "durable_interval_s": None, "durable_every": None,
        "restore_s": {"local": local.restore_local_s(shape) if local else None,
                      "partner": local.restore_partner_s(shape) if local else None, "durable": None},
        "emergency_grace_s": None,
    }


MIN_CORES = 0.01
MAX_CORES = 10_000.0
"""Cores per rank, or busy per rank: a hundredth of a core is no rank, ten thousand no host."""


def _cores(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{flag} takes a number of cores, got {quoted(text)}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{flag} must be a positive number of cores, got {quoted(text)}")
    return check_range(value, what=flag, low=MIN_CORES, high=MAX_CORES, unit=" cores", given=text)


def print_budget(console: Console, job: Job, b: BurstBudget, pace: PacePlan) -> None:
    """The budget as a rich table followed by the verdict paragraph and a recommended pace."""
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
        ("copy (async)", format_duration(b.blocking_s), "device-to-host, largest rank (δ)"),
        ("sync stall", format_duration(b.sync_stall_s), "copy + flush, training waits"),
        ("flush", format_duration(b.flush_s), f"limited by {b.bottleneck}"),
        *pace_rows(pace),
        _metadata_row(b),
        ("interval", format_duration(b.interval_s), _interval_note(b)),
        ("keeps up", "yes" if b.keeps_up else "NO", f"flush takes {b.flush_s / b.interval_s:.0%} of it"),
        ("overhead", f"{b.overhead_fraction:.2%}", f"{format_duration(b.stall_s_per_checkpoint)} per save"),
        ("Young / Daly", f"{format_duration(b.young_interval_s)} / {format_duration(b.optimal_interval_s)}",
         f"δ {format_duration(b.checkpoint_cost_s)}, MTBF {format_duration(b.mtbf_s)}"),
        ("lost per failure", format_duration(b.expected_lost_work_s), "back to the newest committed save"),
        ("GPU-hours lost/day", f"{b.gpu_hours_lost_per_day:,.1f}", f"{b.waste_fraction:.2%} of the job"),
    ]
    if b.restore_s.get("durable") is not None:
        rows.append(("restore (durable)", format_duration(b.restore_s["durable"] or 0.0),
                     "each byte read once, shared over the network"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print()
    console.print(modes_table(b))
    console.print()
    style = _VERDICT_STYLE[b.verdict]
    console.print(f"[{style}]verdict: {b.verdict}[/]  {verdict_paragraph(b)}", highlight=False)
    advice = recommendation(pace)
    if advice:
        console.print(f"[bold]{advice}[/]", highlight=False)


def levels_table(p: TwoLevelPlan) -> Table:
    """Single level against two levels: schedule, lost work and restore per failure, GPU-hours lost per day."""
    t = p.times
    title = f"one level against two ({p.nodes:,} nodes"
    title += f", {p.replicas} partner cop{'y' if p.replicas == 1 else 'ies'} per node)" if p.two_level else ")"
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for header in ("", "save every", "durable every", "lost/failure", "restore", "GPU-h lost/day"):
        table.add_column(header, justify="left" if not header else "right")
    for name, loss in (("single level", p.single), ("two levels", p.two_level)):
        if loss is None:
            continue
        table.add_row(name, format_duration(loss.schedule.local_interval_s),
                      format_duration(loss.schedule.durable_interval_s), _per_failure(loss, "lost_work_s"),
                      _per_failure(loss, "restore_s"), f"{loss.gpu_hours_per_day(p.ranks):,.1f}")
    rates = p.rates.to_json()
    per_day = ", ".join(f"{name} {rates[name] * 86400:.2f}" for name in ("soft", "node", "job"))
    restore = ", ".join(f"{level} {format_duration(s)}" for level, s in
                        (("local", t.restore_local_s), ("partner", t.restore_partner_s),
                         ("durable", t.restore_durable_s)) if s is not None)
    table.caption = (f"failures/day: {per_day}; restore: {restore}"
                     f"{'' if t.durable_restore_measured else ' (durable: read bandwidth unknown, write used)'}; "
                     "model: Di et al., IPDPS 2014")
    table.caption_justify = "left"
    if p.two_level is None:
        table.caption += "; give --local-bandwidth for two levels"
    if p.emergency_grace_s is not None:
        table.caption += (f"\npreemption: the emergency save needs a grace period of at least "
                          f"{format_duration(p.emergency_grace_s)} after SIGTERM (preempt_grace_s; docs/preemption.md)")
    return table


def _per_failure(loss: Loss, key: str) -> str:
    """Rate-weighted mean over the failure classes."""
    total = sum(c["rate_per_s"] for c in loss.classes.values())
    return format_duration(sum(c["rate_per_s"] * c[key] for c in loss.classes.values()) / total)


def modes_table(b: BurstBudget) -> Table:
    """What each save mode costs the training step (the background-cost model)."""
    table = Table(title="cost to the step, per save mode (largest rank)", title_justify="left", box=None,
                  pad_edge=False)
    for header in ("mode", "blocks", "writer CPU", "step inflation", "lost per save", "of the interval"):
        table.add_column(header, justify="left" if header == "mode" else "right")
    for name in MODES:
        m = b.modes[name]
        inflation = "training waits" if m["step_inflation"] is None else f"×{m['step_inflation']:.3f}"
        table.add_row(_MODE_LABELS[name], format_duration(m["blocking_s"]), format_duration(m["background_cpu_s"]),
                      inflation, format_duration(m["lost_per_save_s"]), f"{m['lost_per_save_s'] / b.interval_s:.2%}")
    waits = {_MODE_LABELS[name]: b.modes[name].get("staging_wait_s") or 0.0 for name in MODES}
    if any(waits.values()):
        table.caption = "the optimizer step waits for the device copy's rest after the next forward and backward: " \
            + ", ".join(f"{label} {format_duration(s)}" for label, s in waits.items() if s)
        table.caption_justify = "left"
    return table


def print_sizing(console: Console, model: CheckpointSpec, p: SizingPlan) -> None:
    """The store-free plan: sizes, objects, per-rank bytes, interval arithmetic, then the unknown verdict."""
    table = Table(title="ckptio plan (no store)", show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column(justify="right")
    table.add_column(style="dim")
    par = model.parallelism
    rows = [
        ("model", f"{p.params / 1e9:,.2f} B params", f"{model.weights_dtype} + {model.optimizer}"),
        ("ranks", f"{p.ranks:,}", f"TP {par.tp} × PP {par.pp} × DP {par.dp}, ZeRO-{par.zero}; {p.writers:,} write"),
        ("checkpoint", format_bytes(p.checkpoint_bytes),
         f"{p.objects_per_checkpoint:,} objects, {p.requests_per_checkpoint:,} PUT-class requests"),
        ("largest rank", format_bytes(p.bytes_per_rank_max), "bytes one rank writes"),
        ("blocking (async)", format_duration(p.blocking_s), "device-to-host copy of the largest rank"),
        ("MTBF", format_duration(p.mtbf_s), "used for Young / Daly"),
    ]
    if p.young_interval_s is not None and p.optimal_interval_s is not None:
        rows.append(("Young / Daly", f"{format_duration(p.young_interval_s)} / "
                     f"{format_duration(p.optimal_interval_s)}", "from the blocking copy alone"))
    if p.interval_s is not None:
        steps = f"{p.interval_steps:,} steps, " if p.interval_steps else ""
        rows.append(("interval", format_duration(p.interval_s), f"{steps}{p.interval_source}"))
        rows.append(("saves per day", f"{p.saves_per_day:,.1f}", f"{format_bytes(p.bytes_per_day or 0.0)} per day"))
        rows.append(("store must take", format_rate(p.write_bytes_per_s_to_keep_up or 0.0),
                     "for one flush to end before the next save"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print()
    console.print(f"[bold]verdict: {p.verdict}[/]  {p.reasons[0][0].upper()}{p.reasons[0][1:]}: give "
                  "--profile FILE (from `ckptio probe --out`) or --write-bandwidth for the flush, the cost per "
                  "save mode and a verdict.", highlight=False)


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


def _metadata_row(b: BurstBudget) -> tuple[str, str, str]:
    """One line for the metadata work of a save and its commit: its time, and the operations behind it."""
    per_save, per_commit = (sum(b.metadata_ops[part].values()) for part in ("per_save", "per_commit"))
    return ("commit metadata", format_duration(b.commit_metadata_s),
            f"{per_save:,} ops per save + {per_commit:,} per commit, {b.commit_metadata['rates_source']} rates")


def _interval_note(b: BurstBudget) -> str:
    steps = f"{b.interval_steps:,} steps" if b.interval_steps else ""
    source = "Daly's optimum (no --interval)" if b.interval_source == "daly" else "given"
    return ", ".join(p for p in (steps, source) if p)


def verdict_paragraph(b: BurstBudget) -> str:
    """A few sentences: what the numbers mean and what to change."""
    if b.verdict == "ok":
        ckptio = b.modes["ckptio"]
        return (
            f"The store takes the burst: each save copies its state off the device in "
            f"{format_duration(b.blocking_s)}, which costs ckptio's training "
            f"{format_duration(ckptio['lost_per_save_s'])} (the copy runs beside the next forward and backward), "
            f"and its flush ends {format_duration(b.interval_s - b.flush_s)} before the next save."
        )
    return " ".join(f"{reason[0].upper()}{reason[1:]}." for reason in b.reasons)
