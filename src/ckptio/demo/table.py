"""The demo's numbers and how they are shown: one row per run, computed by the report module from the events.

Every figure in the table comes from :func:`ckptio.obs.report.summarize` over the run's JSONL events, so the
table, ``ckptio report`` and the pictures can never disagree on a definition (see that module's docstring
for "lost" and "flush lag"). Committed steps come from the store itself. This module must never run
anything."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from ckptio.demo.predict import Prediction
from ckptio.obs.report import Summary
from ckptio.plan.units import format_bytes, format_rate

_DEMO_FINDINGS = ("flush-behind", "flush-tight", "stall")
LABELS = {"dcp-sync": "dcp.save (sync)", "dcp-async": "dcp.async_save", "ckptio": "ckptio"}


@dataclass(kw_only=True, slots=True)
class RunRow:
    """One run's line of the table."""

    mode: str
    """dcp-sync, dcp-async or ckptio."""

    median_step_s: float | None
    """Median step time over every rank's steps."""

    p99_step_s: float | None
    """99th percentile step time."""

    stall_per_save_s: float
    """Training time lost per save: (blocking + contention) of the slowest rank ÷ saves."""

    blocked_per_save_s: float
    """Time the training loop spent inside save() per save (the slowest rank)."""

    slowdown_per_save_s: float
    """Extra step time while a flush ran, per save: the writer competing for the CPU (the slowest rank)."""

    lost_fraction: float | None
    """Share of training time lost to checkpoints."""

    median_lag_s: float | None
    """Median save request → committed on every rank."""

    committed: list[int]
    """Steps committed in the store at the end of the run."""

    saves: int
    """Saves requested."""

    wall_s: float
    """Launch to exit of the run's ranks."""


def row_from_summary(mode: str, summary: Summary, committed: list[int], wall_s: float) -> RunRow:
    saves = max(summary.saves, 1)
    return RunRow(
        mode=mode,
        median_step_s=summary.step_s["all"]["p50"],
        p99_step_s=summary.step_s["all"]["p99"],
        stall_per_save_s=summary.lost_s / saves,
        blocked_per_save_s=summary.blocking_s / saves,
        slowdown_per_save_s=summary.contention_s / saves,
        lost_fraction=summary.lost_fraction,
        median_lag_s=summary.median_lag_s,
        committed=committed,
        saves=summary.saves,
        wall_s=wall_s,
    )


def mib_per_s(bytes_per_s: float) -> str:
    """Bandwidth in the unit ``--store-bandwidth`` defaults to."""
    return f"{bytes_per_s / 2**20:.0f} MiB/s"


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def results_table(rows: list[RunRow]) -> Table:
    table = Table()
    headers = (
        "run",
        "median step",
        "p99 step",
        "stall in save()",
        "+ slower steps",
        "time lost",
        "flush lag",
        "committed",
    )
    for header in headers:
        table.add_column(header, justify="left" if header == "run" else "right")
    for row in rows:
        table.add_row(
            LABELS.get(row.mode, row.mode),
            _s(row.median_step_s),
            _s(row.p99_step_s),
            _s(row.blocked_per_save_s),
            _s(row.slowdown_per_save_s),
            _pct(row.lost_fraction),
            _s(row.median_lag_s),
            f"{len(row.committed)}/{row.saves}: " + ",".join(map(str, row.committed)),
        )
    return table


def prediction_heading(prediction: Prediction, *, bandwidth: float) -> str:
    sync = prediction.sync
    return (
        f"[bold]Planner prediction[/]: {format_bytes(sync.checkpoint_bytes)} per checkpoint over "
        f"{sync.ranks} ranks on a {mib_per_s(bandwidth)} store, a save every {sync.interval_steps} steps "
        f"(measured here: {prediction.step_time_s:.2f} s/step, copy {format_rate(prediction.copy_bytes_per_s)})"
    )


def prediction_table(prediction: Prediction) -> Table:
    sync, staged = prediction.sync, prediction.staged
    table = Table()
    for header in ("save", "stall / save", "time lost", "flush", "keeps up"):
        table.add_column(header, justify="left" if header == "save" else "right")
    for label, plan in (("synchronous (dcp.save)", sync), ("staged + background flush (ckptio)", staged)):
        table.add_row(
            label,
            _s(plan.stall_s_per_checkpoint),
            _pct(plan.overhead_fraction),
            _s(plan.flush_s),
            "yes" if plan.keeps_up else "no",
        )
    return table


def prediction_findings(prediction: Prediction) -> list[str]:
    """The planner's findings that concern this demo (the failure-rate interval advice does not: the job is
    minutes long)."""
    found = []
    for label, plan in (("sync", prediction.sync), ("ckptio", prediction.staged)):
        for code, reason in zip(plan.reason_codes, plan.reasons, strict=True):
            if code in _DEMO_FINDINGS:
                found.append(f"{label}: {reason}")
    return found
