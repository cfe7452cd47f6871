"""``ckptio simulate --failures N``: failures injected into the single-level and two-level schedules of the plan.

Owns the flags of the failure injection (``--failures``, ``--seed``; the two-level flags come from
:mod:`ckptio._cli.level_args`), and its table. The simulation is :mod:`ckptio.plan.simulation.failure_injection`'s,
the schedules and the prediction :mod:`ckptio.plan.costs.multilevel`'s. It must never change the burst simulation's
own output.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from ckptio._cli.job_args import Job, int_flag
from ckptio._cli.level_args import add_level_arguments, level_args
from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.multilevel import plan_two_levels
from ckptio.plan.simulation.failure_injection import MAX_FAILURES, compare_with_plan
from ckptio.plan.units import format_duration, quoted


def add_failure_arguments(parser: argparse.ArgumentParser) -> None:
    """``--failures``/``--seed`` and the two-level flags (``simulate`` already has ``--local-bandwidth`` and
    ``--ranks-per-node``)."""
    g = parser.add_argument_group("failures (node loss and whole-job loss, one level against two)")
    g.add_argument("--failures", help="inject about this many failures (MTBF and classes as `plan`) and report "
                   "lost work and restores for the plan's single-level and two-level schedules")
    g.add_argument("--seed", default="0", help="random seed of the failure injection (0)")
    add_level_arguments(parser, shared_with_tiered=True)


@dataclass(kw_only=True, slots=True, frozen=True)
class FailureArgs:
    """``--failures`` and ``--seed``, checked."""

    failures: int
    """Failures to inject (1 to :data:`~ckptio.plan.simulation.failure_injection.MAX_FAILURES`)."""
    seed: int
    """Random seed of the injection."""


MAX_SEED = 2**64 - 1


def failure_args(args: argparse.Namespace) -> FailureArgs | None:
    """``--failures`` and ``--seed`` checked before any simulation runs (the seed even without ``--failures``, so a
    bad one is never silently ignored); None without ``--failures``."""
    seed = int_flag(args.seed, "--seed", low=0, high=MAX_SEED)
    if not args.failures:
        return None
    text = str(args.failures).strip()
    if text.isdigit() and int(text) > MAX_FAILURES:
        # A cap, not a sample: the answer is settled long before this many (MAX_FAILURES says why).
        raise ConfigError(f"--failures {quoted(text)} is more than the simulation needs: at most {MAX_FAILURES:,} "
                          "(its Monte-Carlo spread is then far below the model's own error)")
    return FailureArgs(failures=int_flag(text, "--failures", low=1, high=MAX_FAILURES), seed=seed)


def inject_failures(args: argparse.Namespace, job: Job, counts: FailureArgs | None) -> dict[str, Any] | None:
    """The comparison, or None without ``--failures`` (the two-level flags are checked either way)."""
    levels = level_args(args, step_time_s=job.schedule.step_time_s)
    if counts is None:
        return None
    budget = plan_burst(job.shape, job.storage, job.schedule, network=levels.network)
    plan = plan_two_levels(job.shape, job.storage, job.schedule, budget, local=levels.local,
                           ranks_per_node=levels.ranks_per_node, node_mtbf_s=levels.node_mtbf_s,
                           job_loss_mtbf_s=levels.job_loss_mtbf_s, durable_share=levels.durable_share,
                           local_interval_s=levels.local_every_s, durable_every=levels.durable_every,
                           network=levels.network)
    try:
        return compare_with_plan(plan, failures=counts.failures, seed=counts.seed)
    except ConfigError as exc:  # the simulation's budget (MAX_EVENTS): name the flag that sets the count
        raise ConfigError(f"--failures {counts.failures:,}: {exc.message}") from None


def failures_table(data: dict[str, Any]) -> Table:
    table = Table(title=f"failures injected (seed {data['seed']})", title_justify="left", box=None, pad_edge=False)
    for header in ("", "failures", "lost/failure", "restore", "restores l/p/d", "GPU-h lost/day", "plan"):
        table.add_column(header, justify="left" if not header else "right")
    for name, label in (("single", "single level"), ("two_level", "two levels")):
        r = data[name]
        if r is None:
            continue
        by_level = r["restores_by_level"]
        table.add_row(label, f"{r['failures']:,}", format_duration(r["lost_work_s_mean"]),
                      format_duration(r["restore_s_mean"]),
                      f"{by_level['local']}/{by_level['partner']}/{by_level['durable']}",
                      f"{r['lost_gpu_hours_per_day']:,.1f}", f"{r['plan_lost_gpu_hours_per_day']:,.1f}")
    if data["two_level"] is None:
        table.caption = "give --local-bandwidth for two levels"
    return table
