"""How the demo's numbers are shown: the prediction, the table (one row per run), the first saves, the verdict.

Every measured figure comes from :mod:`ckptio.demo.steady` (per save, on the step kinds and definitions of
:mod:`ckptio.obs.report`); committed steps come from the store itself. This module must never run anything.
"""

from __future__ import annotations

from rich.table import Table

from ckptio.demo.predict import Prediction
from ckptio.demo.resume import ResumeCheck
from ckptio.demo.steady import RunRow
from ckptio.plan.costs.calibration import prediction_error
from ckptio.plan.units import format_bytes, format_rate

_DEMO_FINDINGS = ("flush-behind", "flush-tight", "stall")
LABELS = {"dcp-sync": "dcp.save", "dcp-async": "dcp.async_save", "dcp-best": "DCP-best", "ckptio": "ckptio"}
DCP_MODES = ("dcp-sync", "dcp-async", "dcp-best")


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
        "clean step",
        "stall / save",
        "+ slower steps",
        "lost / save",
        "time lost",
        "flush lag",
        "committed",
    )
    for header in headers:
        table.add_column(header, justify="left" if header == "run" else "right")
    for row in rows:
        table.add_row(
            LABELS.get(row.mode, row.mode),
            _s(row.clean_step_s),
            _s(row.stall_per_save_s),
            _s(row.slower_per_save_s),
            _s(row.lost_per_save_s),
            _pct(row.steady_lost_fraction),
            _s(row.median_lag_s),
            f"{len(row.committed)}/{row.saves}",
        )
    return table


def first_save_lines(rows: list[RunRow]) -> list[str]:
    """The first save of each run, on its own line: it pays the one-time costs the table leaves out."""
    lines = ["[bold]First save[/] (not in the table: planning, slot allocation, DCP-best's process spawn; "
             "the run waits until it is durable):"]
    for row in rows:
        if row.first is None:
            continue
        durable = "—" if row.first_durable_s is None else f"{row.first_durable_s:.2f} s"
        boot = f"; saver ready {row.ready_s:.2f} s before step 1 (writer boot)" if row.ready_s else ""
        lines.append(
            f"  {LABELS.get(row.mode, row.mode):<15} step {row.first.step}: stall {row.first.stall_s:.2f} s, "
            f"time lost {row.first.lost_s:.2f} s, durable after {durable}{boot}"
        )
    return lines


def cpu_line(rows: list[RunRow]) -> str:
    """Where the cores went in each run: the rank processes (training, and DCP's in-process threads) and the
    saver's own processes, all ranks, step 1 to the last save durable."""
    parts = []
    for row in rows:
        extra = f" + saver processes {row.saver_cpu_s:.1f} s" if row.saver_cpu_s >= 0.05 else ""
        parts.append(f"{LABELS.get(row.mode, row.mode)} ranks {row.rank_cpu_s:.1f} s{extra}")
    return "[bold]CPU[/] over each run (all ranks): " + "; ".join(parts) + "."


def _ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None:
        return "—"
    return "inf" if den <= 0 else f"{num / den:.2f}x"


def verdict_line(rows: list[RunRow], resume: ResumeCheck, prediction: Prediction) -> str:
    """One line: ckptio's steady time lost ÷ the best DCP mode's, its stall ÷ DCP-best's, the resume check and its
    restore time ÷ plain ``dcp.load``'s, and the planner's prediction for ckptio against the measurement."""
    by_mode = {row.mode: row for row in rows}
    ckptio = by_mode.get("ckptio")
    dcp = [by_mode[m] for m in DCP_MODES if m in by_mode and by_mode[m].lost_per_save_s is not None]
    if ckptio is None or ckptio.lost_per_save_s is None or not dcp:
        return "[bold]Verdict[/]: not enough steady saves to compare (run with more --saves or --steps)."
    best = min(dcp, key=lambda row: row.lost_per_save_s or 0.0)
    dcp_best = by_mode.get("dcp-best")
    best_stall = dcp_best.stall_per_save_s if dcp_best is not None else None
    predicted = prediction.modes["ckptio"].lost_per_save_s
    exact = "[green]bit-exact[/]" if resume.bit_exact else "[red]NOT bit-exact[/]"
    return (
        f"[bold]Verdict[/]: ckptio loses {ckptio.lost_per_save_s:.2f} s per save = "
        f"{_ratio(ckptio.lost_per_save_s, best.lost_per_save_s)} the best DCP mode's "
        f"({LABELS[best.mode]}, {best.lost_per_save_s:.2f} s); stall {_s(ckptio.stall_per_save_s)} = "
        f"{_ratio(ckptio.stall_per_save_s, best_stall)} DCP-best's ({_s(best_stall)}); resume {exact}, "
        f"{resume.restore_words()}; "
        f"planner predicted {predicted:.2f} s lost per save for ckptio, measured {ckptio.lost_per_save_s:.2f} s "
        f"({_ratio(predicted, ckptio.lost_per_save_s)} predicted ÷ measured, as in the lines above)"
    )


def prediction_heading(prediction: Prediction, *, bandwidth: float) -> str:
    sync, machine = prediction.sync, prediction.machine
    return (
        f"[bold]Planner prediction[/]: {format_bytes(sync.checkpoint_bytes)} per checkpoint over "
        f"{sync.ranks} ranks on a {mib_per_s(bandwidth)} store, a save every {sync.interval_steps} steps "
        f"(measured here: {machine.step_time_s:.2f} s/step, {machine.fresh_copy_drag:+.0%} with a fresh copy "
        f"of the state alive, {_trial(prediction)}; copy "
        f"{format_rate(machine.copy_bytes_per_s)}{_writers(prediction)})"
    )


def _writers(prediction: Prediction) -> str:
    machine = prediction.machine
    parts = [f"torch.save + fsync {format_rate(machine.costs.torch_save_bytes_per_s)} per core"]
    if machine.disk is not None:
        parts.append(f"the disk under the store {format_rate(machine.disk.direct_bytes_per_s)} O_DIRECT, "
                     f"{format_rate(machine.disk.writeback_bytes_per_s)} write-back")
    return "".join(f"; {part}" for part in parts)


def _trial(prediction: Prediction) -> str:
    if prediction.trial_lost_s is None:
        return "no trial save"
    return (f"a trial ckptio save {prediction.trial_lost_s:.2f} s, {prediction.direct_io_s_per_gib:.2f} s/GiB of "
            f"O_DIRECT saves beyond their CPU, {format_bytes(prediction.bytes_per_rank)} from the rank saving the most")


MODEL_KEYS = {"dcp-sync": "dcp_sync", "dcp-async": "dcp_async", "dcp-best": "dcp_best", "ckptio": "ckptio"}
"""The demo's runs → :data:`ckptio.plan.costs.background.MODES`."""


def prediction_table(prediction: Prediction) -> Table:
    """The background-cost model's cost per save for every run, at the demo's interval."""
    interval = prediction.sync.interval_s
    table = Table()
    for header in ("save", "stall / save", "lost / save", "time lost", "flush", "keeps up"):
        table.add_column(header, justify="left" if header == "save" else "right")
    for run, key in MODEL_KEYS.items():
        cost = prediction.modes[key]
        flush = cost.flush_s if cost.step_inflation is not None else cost.blocking_s
        table.add_row(
            LABELS[run],
            _s(cost.blocking_s),
            _s(cost.lost_per_save_s),
            _pct(cost.lost_per_save_s / interval if interval > 0 else None),
            _s(flush),
            "yes" if flush <= interval else "no",
        )
    return table


def prediction_check_lines(rows: list[RunRow], prediction: Prediction) -> list[str]:
    """Predicted against measured time lost per save, per run: the ratio, and the difference in percentage points
    of the training time between saves (the planner's bar: within 20 % or 3 points)."""
    lines = ["[bold]Planner against measurement[/], time lost per save (predicted ÷ measured; predicted − measured "
             "in points of the time between saves):"]
    for row in rows:
        key = MODEL_KEYS.get(row.mode)
        if key is None or row.lost_per_save_s is None or row.clean_step_s is None:
            continue
        predicted, measured = prediction.modes[key].lost_per_save_s, row.lost_per_save_s
        between = (prediction.sync.interval_steps or 0) * row.clean_step_s
        _, points, within = prediction_error(predicted, measured, between)
        mark = "[green]✓[/]" if within else "[yellow]off[/]"
        lines.append(f"  {LABELS[row.mode]:<15} predicted {predicted:.2f} s, measured {measured:.2f} s "
                     f"({_ratio(predicted, measured)}, {points:+.1f} points) {mark}")
    return lines


def prediction_findings(prediction: Prediction) -> list[str]:
    """The planner's findings that concern this demo (the failure-rate interval advice does not: the job is
    minutes long)."""
    found = []
    for label, plan in (("sync", prediction.sync), ("ckptio", prediction.staged)):
        for code, reason in zip(plan.reason_codes, plan.reasons, strict=True):
            if code in _DEMO_FINDINGS:
                found.append(f"{label}: {reason}")
    return found
