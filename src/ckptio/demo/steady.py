"""The demo's numbers per save: the first save apart, and steady-state medians over the others.

The first save of every mode pays one-time costs (ckptio: planning and the staging slots; DCP: planning,
and for DCP-best the spawn of its checkpoint process), so a table mixing it into the mean tells little
about a long job. This module splits a run into that first save and the steady saves after it, and reports
each steady figure as a median over saves. A save's stall and flush lag are the slowest rank's (ranks run in
lockstep: the others wait for it at the next collective); its time lost is the mean over ranks, as in the
benchmarks: within a step, lockstep ranks run ahead of or behind each other, and over one save's flush steps
that offset moves by up to a step and moves back later, so one rank's sum over those steps is high by what
another's is low, and their maximum takes the high side at every save (docs/planning-measurements.md). The mean
is the job's loss; a rank's stall is in it once per rank, its own
in ``save()`` and the others' as their wait at the next collective.

Per save, with the step kinds of :mod:`ckptio.obs.report` (``staging``, ``flush``, ``clean``):

* stall = time in ``save()`` + the wait for its staging copy before the next optimizer step (DCP-best);
* time lost = time in ``save()`` + Σ over the ``flush`` steps overlapping its flush of (step − the rank's
  mean clean step) — the report's definition, per save (a staging wait sits inside a flush step, so it is
  counted once) — averaged over ranks, and at least the stall;
* slower steps = time lost − stall, floored at 0;
* flush lag = save() call → committed.

This module must never run anything nor print: it reads a run's events and its ranks' results.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ckptio.demo.job import RankResult
from ckptio.obs.timeline import SaveTrace, StepSample, Timeline


@dataclass(kw_only=True, slots=True)
class SaveFigures:
    """One save: its stall and lag as the slowest rank saw them, its time lost as the ranks did on average."""

    step: int
    """The step saved."""

    stall_s: float
    """Training thread blocked: in save() plus the staging wait."""

    lost_s: float
    """Training time lost to this save: time in save() plus slower steps during its flush, the mean over ranks
    (at least the stall)."""

    lag_s: float | None
    """save() call → committed, None if it never committed."""

    @property
    def slower_s(self) -> float:
        return max(0.0, self.lost_s - self.stall_s)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(kw_only=True, slots=True)
class RunRow:
    """One run's line of the table: the first save apart, the steady saves as medians."""

    mode: str
    """dcp-sync, dcp-async, dcp-best or ckptio."""

    median_step_s: float | None
    """Median step time over every rank's steps."""

    clean_step_s: float | None
    """Mean step time of steps that overlap no save and no flush (the baseline of time lost)."""

    first: SaveFigures | None
    """The first save."""

    first_durable_s: float | None
    """First save() call → durable on every rank (the run waits for it before going on)."""

    ready_s: float
    """Wait before step 1 for the saver (ckptio: its writer process booting)."""

    steady: list[SaveFigures] = field(default_factory=list)
    """Every save after the first."""

    steady_lost_fraction: float | None = None
    """Σ steady time lost ÷ training time after the first save."""

    committed: list[int] = field(default_factory=list)
    """Steps committed in the store at the end of the run."""

    saves: int = 0
    """Saves requested."""

    wall_s: float = 0.0
    """Set-up to last save durable (slowest rank)."""

    rank_cpu_s: float = 0.0
    """CPU seconds of the rank processes from step 1 to the end, all ranks."""

    saver_cpu_s: float = 0.0
    """CPU seconds of their child processes (ckptio's writers, DCP-best's checkpoint processes), all ranks."""

    @property
    def stall_per_save_s(self) -> float | None:
        return _median([s.stall_s for s in self.steady])

    @property
    def slower_per_save_s(self) -> float | None:
        return _median([s.slower_s for s in self.steady])

    @property
    def lost_per_save_s(self) -> float | None:
        return _median([s.lost_s for s in self.steady])

    @property
    def median_lag_s(self) -> float | None:
        return _median([s.lag_s for s in self.steady if s.lag_s is not None])


def _clean_mean(steps: list[StepSample]) -> float | None:
    """A rank's expected step time with no checkpoint work: the mean, not the median (see obs.summary)."""
    clean = [s.seconds for s in steps if s.kind == "clean"]
    return statistics.fmean(clean) if clean else None


def _lost(trace: SaveTrace, steps: list[StepSample], clean: float | None) -> float:
    """save() time + the excess of the flush steps overlapping this save's flush (not floored: a rank's sum is
    as likely low as high, see the module's docstring)."""
    if clean is None or trace.returned is None:
        return trace.blocking_s
    end = trace.flush_end if trace.flush_end is not None else float("inf")
    excess = sum(
        s.seconds - clean
        for s in steps
        if s.kind == "flush" and s.start < end and s.start + s.seconds > trace.returned
    )
    return trace.blocking_s + excess


def per_save(timeline: Timeline, results: list[RankResult]) -> list[SaveFigures]:
    """Every save of the run, in step order: stall and lag the slowest rank's, time lost the mean over ranks."""
    waits = {(r.rank, s.step): s.staging_wait_s for r in results for s in r.saves}
    by_step: dict[int, list[tuple[float, float, float | None]]] = {}
    for rank, traces in timeline.saves.items():
        steps = timeline.steps.get(rank, [])
        clean = _clean_mean(steps)
        for trace in traces:
            if trace.requested is None:
                continue
            stall = trace.blocking_s + waits.get((rank, trace.step), 0.0)
            by_step.setdefault(trace.step, []).append((stall, _lost(trace, steps, clean), trace.lag_s))
    out = []
    for step in sorted(by_step):
        figures = by_step[step]
        lags = [lag for _, _, lag in figures if lag is not None]
        stall = max(stall for stall, _, _ in figures)
        out.append(
            SaveFigures(
                step=step,
                stall_s=stall,
                lost_s=max(stall, statistics.fmean(lost for _, lost, _ in figures)),
                lag_s=max(lags) if lags else None,
            )
        )
    return out


def _steady_training_s(timeline: Timeline, first_step: int) -> float:
    """Training time after the first save: from the start of the step after it to the last step's end."""
    spans = []
    for steps in timeline.steps.values():
        after = [s for s in steps if s.step is not None and s.step > first_step]
        if after:
            spans.append(max(s.start + s.seconds for s in after) - min(s.start for s in after))
    return max(spans, default=0.0)


def run_row(mode: str, timeline: Timeline, results: list[RankResult]) -> RunRow:
    """The table row of one run, from its events' timeline and its ranks' results."""
    saves = per_save(timeline, results)
    all_steps = [s.seconds for steps in timeline.steps.values() for s in steps]
    clean = [s.seconds for steps in timeline.steps.values() for s in steps if s.kind == "clean"]
    first, steady = (saves[0], saves[1:]) if saves else (None, [])
    durable = [r.first_durable_s for r in results if r.first_durable_s is not None]
    training = _steady_training_s(timeline, first.step) if first is not None else 0.0
    return RunRow(
        mode=mode,
        median_step_s=_median(all_steps),
        clean_step_s=statistics.fmean(clean) if clean else None,
        first=first,
        first_durable_s=max(durable) if durable else None,
        ready_s=max((r.ready_s for r in results), default=0.0),
        steady=steady,
        steady_lost_fraction=sum(s.lost_s for s in steady) / training if steady and training > 0 else None,
        committed=results[0].committed if results else [],
        saves=len(saves),
        wall_s=max((r.wall_s for r in results), default=0.0),
        rank_cpu_s=sum(r.rank_cpu_s for r in results),
        saver_cpu_s=sum(r.saver_cpu_s for r in results),
    )
