"""``ckptio demo``: plan the interval, run the same job four ways, resume, and show what it cost.

Phases, each announced on the console: a quick measurement of this machine (:mod:`ckptio.demo.measure`: per-byte
costs, the disk, step time, copy bandwidth); the planner's interval — the shortest at which ckptio's flush keeps up
with headroom, unless ``--every`` says otherwise; a trial ckptio save on the job's own ranks (the calibrate launch);
the prediction; a run with ``dcp.save``, one with default ``dcp.async_save``, one with DCP's best async path
(DCP-best) and one with ckptio, every run a fresh process group on the same emulated store with the same save steps;
then a resume of the newest ckptio step in another fresh process group, whose losses must equal the uninterrupted
run's bit for bit, its restore timed against plain ``dcp.load`` of the ``dcp.save`` run's copy of the same step
(:mod:`ckptio.demo.resume`). Finally the table (the first save of each mode apart, the steady saves as medians), the
reports rendered from the events, and one verdict line. This module only sequences and prints, and must never
measure anything itself: :mod:`ckptio.demo.measure` measures the machine, the ranks measure the saves and the
restores, :mod:`ckptio.demo.steady` summarizes."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ckptio._proc import sigterm_as_interrupt
from ckptio.demo.console_tables import (
    LABELS,
    cpu_line,
    first_save_lines,
    mib_per_s,
    prediction_check_lines,
    prediction_findings,
    prediction_heading,
    prediction_table,
    results_table,
    verdict_line,
)
from ckptio.demo.demo_config import DemoConfig
from ckptio.demo.job import Mode, RankJob, RankResult, StoreSpec, save_steps
from ckptio.demo.launcher import run_ranks
from ckptio.demo.measure import MachineFigures, measure_machine
from ckptio.demo.predict import IntervalChoice, Prediction, choose_every, given_every, predict
from ckptio.demo.resume import ResumeCheck
from ckptio.demo.savers import prune_older_steps
from ckptio.demo.space import check_store_space, store_bytes_needed
from ckptio.demo.steady import RunRow, run_row
from ckptio.errors import CkptError
from ckptio.plan.units import format_bytes
from ckptio.testing.moto_s3 import BUCKET, embedded_s3

RUN_MODES: tuple[Mode, ...] = ("dcp-sync", "dcp-async", "dcp-best", "ckptio")
_CKPTIO_FIRST: tuple[Mode, ...] = ("ckptio", *(m for m in RUN_MODES if m != "ckptio"))
"""The order the runs go in. ckptio first, right after the trial save that calibrates its prediction, on ranks
that have seen only that trial, as a job starts right after its plan: after the three DCP modes, whose checkpoints
fill the page cache, it meets a host its trial did not (bench/bench_planner.py, ``run_order``)."""


@dataclass(kw_only=True, slots=True)
class DemoOutcome:
    """What ``run_demo`` produced, for the CLI and the tests."""

    config: DemoConfig
    """The configuration run, interval and steps resolved."""

    choice: IntervalChoice
    """The interval and the planner's reason."""

    prediction: Prediction
    """The planner's prediction at that interval."""

    rows: list[RunRow]
    """One row per run."""

    resume: ResumeCheck
    """The resume comparison."""

    reports: dict[str, str]
    """Report file per run (HTML), ckptio's first."""

    verdict: str
    """The closing line."""

    wall_s: float
    """Whole demo, seconds."""


class _Layout:
    """Paths of one demo under ``out``."""

    def __init__(self, out: str) -> None:
        self.out = os.path.abspath(out)
        self.store = os.path.join(self.out, "store")
        self.events = os.path.join(self.out, "events")
        self.results = os.path.join(self.out, "results")
        self.work = os.path.join(self.out, "run")
        self.report = os.path.join(self.out, "report")

    def reset(self) -> None:
        # Only the demo's own subfolders are cleared: ``out`` may be a folder the user keeps other things in.
        for folder in (self.store, self.events, self.results, self.work, self.report):
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)


def run_demo(config: DemoConfig, console: Console | None = None) -> DemoOutcome:
    """Run the whole demo; raises :class:`~ckptio.errors.CkptError` when a run fails."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a log file: wide enough that the tables do not wrap
            console.width = max(console.width, 120)
    began = time.monotonic()
    paths = _Layout(config.out)
    paths.reset()
    with sigterm_as_interrupt(), _store_context(config) as s3_endpoint:
        config, choice, prediction = _plan(console, config, paths, s3_endpoint)
        results = _launch(console, config, paths, list(_CKPTIO_FIRST), s3_endpoint)
        rows = [_row(paths, mode, results[mode]) for mode in RUN_MODES]
        resumed = _launch(console, config, paths, ["resume"], s3_endpoint,
                          dcp_copy_root=_store_spec(config, paths, "dcp-sync", None).root)["resume"]
        # Every run's checkpoints but its newest stay until every run is measured: files deleted a moment ago hand
        # their page-cache pages, several times cheaper to take again on a VM, to the next run's saves
        # (bench_planner keeps its stores for the same reason).
        for mode in RUN_MODES:
            committed = next((r.committed for r in results[mode] if r.committed), [])
            prune_older_steps(_store_spec(config, paths, mode, s3_endpoint), committed)
    check = ResumeCheck.of(resumed, results["ckptio"][0], s3=s3_endpoint is not None)
    _show_results(console, rows, check, prediction)
    reports = _write_reports(console, paths)
    verdict = verdict_line(rows, check, prediction)
    wall = time.monotonic() - began
    console.print(f"demo finished in {wall:.0f} s; everything is under {paths.out}")
    console.print(verdict)
    outcome = DemoOutcome(
        config=config,
        choice=choice,
        prediction=prediction,
        rows=rows,
        resume=check,
        reports=reports,
        verdict=verdict,
        wall_s=wall,
    )
    if not check.bit_exact:
        raise CkptError("the resumed run's losses differ from the uninterrupted run's (see above)")
    return outcome


def _show_results(console: Console, rows: list[RunRow], check: ResumeCheck, prediction: Prediction) -> None:
    """The resume's comparison, what each measured figure means, the table, the first saves against the
    prediction, and the CPU the runs used."""
    for line in check.lines():
        console.print(line)
    console.print(
        "[bold]Measured[/], per save after the first (median over saves): stall = training thread blocked (in "
        "save(), and waiting for the staging copy before the next optimizer step; slowest rank); time lost = "
        "stall + extra step time while the flush ran, over the mean step without one (mean over ranks: lockstep "
        "ranks' sums over a few steps differ by how far one runs ahead of the other); slower steps = time lost − "
        "stall; also as a share of training time; flush lag = save() call → committed (slowest rank)."
    )
    console.print(results_table(rows))
    for line in first_save_lines(rows) + prediction_check_lines(rows, prediction):
        console.print(line)
    console.print(cpu_line(rows))


@contextlib.contextmanager
def _store_context(config: DemoConfig) -> Iterator[str | None]:
    if config.store == "s3":
        with embedded_s3() as endpoint:
            yield endpoint
    else:
        yield None


def _intro(console: Console, config: DemoConfig, s3_endpoint: str | None) -> None:
    state = config.shape.state_bytes()
    where = f"an embedded S3 server ({s3_endpoint})" if s3_endpoint else "a directory"
    console.print(
        f"[bold]ckptio demo[/]: {config.ranks} ranks (gloo, CPU) train a transformer with Adam for "
        f"{config.steps} steps, saving every {config.every}; checkpoint {format_bytes(state)} "
        f"({format_bytes(state / config.ranks)} per rank) to {where} behind a "
        f"{mib_per_s(config.store_bandwidth)} shared-bandwidth throttle; saved four ways: dcp.save, "
        "dcp.async_save, DCP-best (checkpoint process + async staging into shared memory), ckptio."
    )
    if s3_endpoint:
        console.print("  (torch has no S3 writer: the DCP baselines write to the directory store, same throttle.)")


def _plan(
    console: Console, config: DemoConfig, paths: _Layout, s3_endpoint: str | None
) -> tuple[DemoConfig, IntervalChoice, Prediction]:
    """Have this machine measured, let the planner pick (or judge) the interval, have the ranks try a save, and
    predict the saves' cost."""
    console.print("[dim]· measuring step time, per-byte costs and the disk for the planner…[/]")
    direct_io = config.store == "posix"
    machine = measure_machine(config.shape, world=config.ranks, seed=config.seed, store_dir=paths.store,
                              disk=direct_io)
    world, bandwidth = config.ranks, config.store_bandwidth
    choice = _choose_interval(config, machine)
    config = config.with_every(choice.every)
    _check_space(config, paths, s3_endpoint, direct_io=direct_io)
    _intro(console, config, s3_endpoint)
    console.print(f"[bold]Interval[/]: {choice.reason()}")
    # ckptio writes the directory store with O_DIRECT: what that I/O costs the steps is measured by a trial save on
    # the job's own ranks (the S3 store's bytes go through a socket instead).
    calibrated = _launch(console, config, paths, ["calibrate"], None)["calibrate"] if direct_io else []
    trials = [r.trial_lost_s for r in calibrated if r.trial_lost_s is not None]
    # Ranks in lockstep wait for the one that saves the most; the trial saves say which and how much.
    largest = max((r.trial_bytes for r in calibrated if r.trial_bytes), default=None)
    prediction = predict(
        config.shape,
        world=world,
        bytes_per_s=bandwidth,
        every=choice.every,
        machine=machine,
        direct_io=direct_io,
        trial_lost_s=statistics.fmean(trials) if trials else None,
        largest_rank_bytes=largest,
    )
    console.print(prediction_heading(prediction, bandwidth=config.store_bandwidth))
    console.print(prediction_table(prediction))
    for finding in prediction_findings(prediction):
        console.print(f"  [dim]planner: {finding}[/]")
    return config, choice, prediction


def _choose_interval(config: DemoConfig, machine: MachineFigures) -> IntervalChoice:
    """The planner's interval on ``machine``'s figures: its own pick, or its judgement of ``--every``."""
    state, world, bandwidth = config.shape.state_bytes(), config.ranks, config.store_bandwidth
    if config.every is None:
        return choose_every(state, world=world, bytes_per_s=bandwidth, step_time_s=machine.step_time_s,
                            copy_bytes_per_s=machine.copy_bytes_per_s)
    return given_every(state, every=config.every, world=world, bytes_per_s=bandwidth,
                       step_time_s=machine.step_time_s, copy_bytes_per_s=machine.copy_bytes_per_s)


def _check_space(config: DemoConfig, paths: _Layout, s3_endpoint: str | None, *, direct_io: bool) -> None:
    """Every run's saves stay until all are measured: refuse now, not on a full disk minutes into a run."""
    assert config.every is not None  # resolved by the interval choice
    state = config.shape.state_bytes()
    runs = len(RUN_MODES) - (s3_endpoint is not None)
    saves = len(save_steps(every=config.every, steps=config.steps or 0))
    check_store_space(paths.store, store_bytes_needed(state_bytes=state, saves_per_run=saves, directory_runs=runs,
                                                      calibrate=direct_io),
                      what=f"{runs} runs x {saves} saves of {format_bytes(state)}, kept until every run is measured")


def _store_spec(config: DemoConfig, paths: _Layout, mode: Mode, s3_endpoint: str | None) -> StoreSpec:
    name = "ckptio" if mode == "resume" else mode
    throttle = os.path.join(paths.store, f"{name}.throttle")
    if s3_endpoint and name == "ckptio":
        return StoreSpec(
            kind="s3",
            root=f"s3://{BUCKET}/{name}",
            bytes_per_s=config.store_bandwidth,
            throttle_state=throttle,
            fsync=config.fsync,
            options={"endpoint_url": s3_endpoint, "region": "us-east-1"},
        )
    return StoreSpec(
        root=os.path.join(paths.store, name),
        bytes_per_s=config.store_bandwidth,
        throttle_state=throttle,
        fsync=config.fsync,
    )


_RUN_LABELS = {**LABELS, "resume": "resume from newest ckptio step", "calibrate": "calibrate: a trial ckptio save"}


def _label(mode: str) -> str:
    return _RUN_LABELS[mode]


def _launch(
    console: Console, config: DemoConfig, paths: _Layout, runs: list[Mode], s3_endpoint: str | None, *,
    dcp_copy_root: str | None = None,
) -> dict[str, list[RankResult]]:
    """One launch of fresh rank processes doing ``runs`` in order, with a progress bar per run (a resume's restore
    is timed against ``dcp.load`` of the checkpoint under ``dcp_copy_root``)."""
    assert config.steps is not None and config.every is not None  # resolved by _plan
    job = RankJob(
        runs=runs,
        world=config.ranks,
        store_port=0,
        steps=config.steps,
        every=config.every,
        seed=config.seed,
        shape=config.shape,
        stores={run: _store_spec(config, paths, run, s3_endpoint) for run in runs},
        events_dir=paths.events,
        results_dir=paths.results,
        progress_path=os.path.join(paths.work, "progress"),
        dcp_copy_root=dcp_copy_root,
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        tasks = {run: progress.add_task(f"{_label(run):<32}", total=job.steps, start=False) for run in runs}

        started: set[str] = set()

        def on_step(run: str, step: int) -> None:
            if run not in tasks:
                return
            if run not in started:  # a line per phase too, for logs where the bars do not show
                started.add(run)
                progress.console.print(f"[dim]· {_label(run)} …[/]")
                progress.start_task(tasks[run])
            for earlier in runs[: runs.index(run)]:
                progress.update(tasks[earlier], completed=job.steps)
            progress.update(tasks[run], completed=step)

        results = run_ranks(job, work_dir=paths.work, on_step=on_step, timeout_s=config.timeout_s)
    for run in runs:
        wall = max(r.wall_s for r in results[run])
        console.print(f"[green]✓[/] {_label(run):<32} {wall:5.1f} s" if wall else f"[green]✓[/] {_label(run)}")
    return results


def _row(paths: _Layout, mode: str, results: list[RankResult]) -> RunRow:
    from ckptio.obs.report import build_timeline, load_events

    timeline = build_timeline(load_events(os.path.join(paths.events, f"{mode}.rank{{rank}}.jsonl")))
    return run_row(mode, timeline, results)


def _write_reports(console: Console, paths: _Layout) -> dict[str, str]:
    from ckptio.obs.report import load_events, write_report

    reports: dict[str, str] = {}
    for mode in _CKPTIO_FIRST:
        records = load_events(os.path.join(paths.events, f"{mode}.rank{{rank}}.jsonl"))
        out = os.path.join(paths.report, f"{mode}.html")
        try:
            # The page embeds the picture; a separate PNG only for the headline run (each render costs seconds).
            extra = [os.path.join(paths.report, f"{mode}.png")] if mode == "ckptio" else []
            for path in [out, *extra]:
                write_report(records, path, title=f"ckptio demo: {LABELS[mode]}")
        except (ImportError, CkptError) as exc:
            console.print(f"[yellow]report for {mode} not written: {exc}[/]")
            continue
        reports[mode] = out
    if reports:
        console.print(f"Report: {reports.get('ckptio', next(iter(reports.values())))}")
        others = [path for mode, path in reports.items() if mode != "ckptio"]
        if others:
            console.print("        baselines: " + ", ".join(others))
    return reports
