"""What checkpoints cost a run: the summary numbers of a timeline, and the verdicts drawn from them.

Every number is defined in the module docstring of :mod:`ckptio.obs.report` (seconds lost, flush throughput,
flush lag and its growth). Must never read files nor draw: it works on a :class:`Timeline` only.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ckptio.obs.timeline import SaveTrace, StepSample, Timeline, build_timeline

__all__ = ["RankSummary", "Summary", "summarize", "summary_to_json"]


@dataclass(kw_only=True, slots=True)
class RankSummary:
    """Numbers of one rank."""

    rank: int
    """Global rank."""
    steps: dict[str, int]
    """Step count per kind (clean, staging, flush)."""
    step_s: dict[str, dict[str, float | None]]
    """p50/p99 step seconds per kind, and ``all``."""
    training_s: float
    """First step start → last step end."""
    blocking_s: float
    """Σ save() blocking seconds."""
    contention_s: float
    """Σ (flush step − mean clean step), floored at 0."""
    lost_s: float
    """blocking_s + contention_s."""
    saves: int
    """Saves requested."""
    committed: int
    """Saves committed."""
    skipped: int
    """Saves skipped."""
    failed: int
    """Saves failed."""
    in_flight: int
    """Saves neither committed, failed nor skipped by the end of the log."""
    bytes: int
    """Bytes of committed saves."""
    flush_s: float
    """Σ flush seconds of committed saves."""
    flush_throughput_Bps: float | None
    """bytes ÷ flush_s."""
    median_flush_s: float | None
    """Median flush seconds."""


@dataclass(kw_only=True, slots=True)
class Summary:
    """What checkpoints cost the run: see :mod:`ckptio.obs.report` for each definition."""

    ranks: list[RankSummary]
    """Per rank."""
    step_s: dict[str, dict[str, float | None]]
    """p50/p99 step seconds per kind over all ranks' steps."""
    training_s: float
    """Longest rank's training span."""
    lost_s: float
    """Seconds of training lost to checkpoints (max over ranks)."""
    lost_fraction: float | None
    """lost_s ÷ training_s."""
    blocking_s: float
    """Largest Σ blocking seconds of a rank."""
    contention_s: float
    """Largest contention of a rank."""
    saves: int
    """Distinct save steps requested."""
    committed: int
    """Distinct steps committed on every rank that requested them."""
    skipped_steps: list[int]
    """Steps skipped (on any rank)."""
    failed_steps: list[int]
    """Steps that failed on some rank."""
    retries: int
    """Retry events."""
    writer_deaths: int
    """writer_died events."""
    bytes: int
    """Bytes of committed saves, all ranks."""
    flush_throughput_Bps: float | None
    """Job flush throughput (see :mod:`ckptio.obs.report`)."""
    median_interval_s: float | None
    """Median time between save requests."""
    lags: list[tuple[int, float]]
    """(step, flush lag) per committed save."""
    median_lag_s: float | None
    """Median flush lag."""
    lag_growth_s_per_save: float | None
    """Least-squares slope of lag against save index (needs 3 saves)."""
    paced_saves: int = 0
    """Committed saves whose durable flush was paced (``flush_pace``)."""
    median_pace_stretch_s: float | None = None
    """Median time the pace held a paced flush back (the part of the lag it added)."""
    verdicts: list[str] = field(default_factory=list)
    """One line per finding, most important first."""


_KINDS = ("clean", "staging", "flush")


def _pcts(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


def _rank_summary(rank: int, steps: list[StepSample], saves: list[SaveTrace]) -> RankSummary:
    by_kind = {k: [s.seconds for s in steps if s.kind == k] for k in _KINDS}
    step_s = {k: _pcts(v) for k, v in by_kind.items()} | {"all": _pcts([s.seconds for s in steps])}
    # The mean, not the median: step times skew right (a slow step now and then, in clean steps as in flush
    # steps), so Σ (step − median) over any run of steps is positive with no checkpoint running at all.
    clean = float(np.mean(by_kind["clean"])) if by_kind["clean"] else None
    contention = 0.0 if clean is None else max(0.0, sum(v - clean for v in by_kind["flush"]))
    blocking = sum(s.blocking_s for s in saves)
    done = [s for s in saves if s.committed is not None]
    nbytes, flush_s = sum(s.bytes for s in done), sum(s.flush_s or 0.0 for s in done)
    flushes = [s.flush_s for s in done if s.flush_s is not None]
    return RankSummary(
        rank=rank,
        steps={k: len(v) for k, v in by_kind.items()},
        step_s=step_s,
        training_s=(max(s.start + s.seconds for s in steps) - min(s.start for s in steps)) if steps else 0.0,
        blocking_s=blocking,
        contention_s=contention,
        lost_s=blocking + contention,
        saves=sum(1 for s in saves if s.requested is not None),
        committed=len(done),
        skipped=sum(1 for s in saves if s.skipped_at is not None),
        failed=sum(1 for s in saves if s.failed is not None),
        in_flight=sum(1 for s in saves if s.committed is None and s.failed is None and s.skipped_at is None),
        bytes=nbytes,
        flush_s=flush_s,
        flush_throughput_Bps=nbytes / flush_s if flush_s > 0 else None,
        median_flush_s=float(np.median(flushes)) if flushes else None,
    )


def summarize(records: list[dict[str, Any]], timeline: Timeline | None = None) -> Summary:
    """The summary of a run's events (as returned by :func:`load_events`)."""
    tl = build_timeline(records) if timeline is None else timeline
    ranks = [_rank_summary(rank, tl.steps[rank], tl.saves[rank]) for rank in sorted(tl.steps)]
    all_saves = [s for rank in tl.saves for s in tl.saves[rank]]
    all_steps = [s for rank in tl.steps for s in tl.steps[rank]]
    by_step: dict[int, list[SaveTrace]] = defaultdict(list)
    for s in all_saves:
        by_step[s.step].append(s)
    committed = {st: ss for st, ss in by_step.items() if all(s.committed is not None for s in ss)}
    slowest = sum(max(s.flush_s or 0.0 for s in ss) for ss in committed.values())
    total_bytes = sum(s.bytes for ss in committed.values() for s in ss)
    lags = sorted(
        (st, max(s.lag_s for s in ss if s.lag_s is not None))
        for st, ss in committed.items()
        if any(s.lag_s is not None for s in ss)
    )
    intervals = [s.interval_s for s in all_saves if s.interval_s is not None]
    training = max((r.training_s for r in ranks), default=0.0)
    lost = max((r.lost_s for r in ranks), default=0.0)
    summary = Summary(
        ranks=ranks,
        step_s={k: _pcts([s.seconds for s in all_steps if s.kind == k]) for k in _KINDS}
        | {"all": _pcts([s.seconds for s in all_steps])},
        training_s=training,
        lost_s=lost,
        lost_fraction=lost / training if training > 0 else None,
        blocking_s=max((r.blocking_s for r in ranks), default=0.0),
        contention_s=max((r.contention_s for r in ranks), default=0.0),
        saves=len({s.step for s in all_saves if s.requested is not None}),
        committed=len(committed),
        skipped_steps=sorted({s.step for s in all_saves if s.skipped_at is not None}),
        failed_steps=sorted({s.step for s in all_saves if s.failed is not None}),
        retries=tl.retries,
        writer_deaths=tl.writer_deaths,
        bytes=total_bytes,
        flush_throughput_Bps=total_bytes / slowest if slowest > 0 else None,
        median_interval_s=float(np.median(intervals)) if intervals else None,
        lags=lags,
        median_lag_s=float(np.median([lag for _, lag in lags])) if lags else None,
        lag_growth_s_per_save=float(np.polyfit(range(len(lags)), [lag for _, lag in lags], 1)[0])
        if len(lags) >= 3
        else None,
    )
    stretches = [max(s.pace_stretched_s for s in ss) for ss in committed.values()
                 if any(s.pace_target_Bps for s in ss)]
    summary.paced_saves = len(stretches)
    summary.median_pace_stretch_s = float(np.median(stretches)) if stretches else None
    summary.verdicts = _verdicts(summary, tl)
    return summary


def summary_to_json(summary: Summary, *, indent: int | None = 2) -> str:
    """The summary as JSON (``ckptio report --json``); NaN and infinities become null."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(asdict(summary)), indent=indent)


# ------------------------------------------------------------------------------------------ verdicts
def _verdicts(s: Summary, tl: Timeline) -> list[str]:
    out: list[str] = []
    if s.lost_fraction is not None:
        out.append(
            f"checkpoints cost {s.lost_s:.2f} s of {s.training_s:.1f} s of training"
            f" ({100 * s.lost_fraction:.1f}%):"
            f" {s.blocking_s:.2f} s blocked in save(), {s.contention_s:.2f} s of slower steps during flushes"
        )
    elif s.saves:
        out.append(
            f"no step events: save() blocked {s.blocking_s:.2f} s in all; wrap training steps in StepTimer"
            " (or ck.step_timer) to see what the flushes cost the steps"
        )
    out.extend(_lag_verdicts(s))
    out.extend(_skip_and_failure_verdicts(s, tl))
    if s.writer_deaths:
        out.append(f"{s.writer_deaths} writer process(es) died")
    if s.retries:
        out.append(f"{s.retries} storage retries")
    clean, flush = s.step_s["clean"]["p50"], s.step_s["flush"]["p50"]
    if clean and flush and flush > 1.05 * clean:
        out.append(
            f"steps during a flush are {100 * (flush / clean - 1):.0f}% slower (p50 {1e3 * flush:.0f} ms vs"
            f" {1e3 * clean:.0f} ms clean): the writer competes with training"
        )
    out.extend(_straggler(s))
    in_flight = sum(r.in_flight for r in s.ranks)
    if in_flight:
        out.append(f"{in_flight} save(s) still in flight when the log ends")
    if len(out) == 1 and s.lost_fraction is not None and s.lost_fraction < 0.01:
        out.append("no checkpoint cost worth chasing: look elsewhere for step-time spikes")
    return out


def _lag_verdicts(s: Summary) -> list[str]:
    growth, interval = s.lag_growth_s_per_save, s.median_interval_s
    scale = interval if interval else (s.median_lag_s or 0.0)
    if growth is not None and scale > 0 and growth > 0.1 * scale:
        return [f"flush never catches up: lag grows {growth:.1f} s per save (interval {scale:.1f} s)"]
    if interval and s.median_lag_s and s.median_lag_s > interval:
        return [f"flush lag ({s.median_lag_s:.1f} s) exceeds the save interval ({interval:.1f} s)"]
    if s.paced_saves and interval and s.median_lag_s is not None:
        # A paced flush is meant to take longer: say that it still keeps up, and how much of its lag is the pace.
        return [f"paced flushes keep up: median lag {s.median_lag_s:.1f} s ({s.median_pace_stretch_s or 0.0:.1f} s "
                f"of it pacing) within the {interval:.1f} s save interval"]
    return []


def _skip_and_failure_verdicts(s: Summary, tl: Timeline) -> list[str]:
    out = []
    if s.skipped_steps:
        steps = ", ".join(map(str, s.skipped_steps[:8])) + (" …" if len(s.skipped_steps) > 8 else "")
        ranks = set(tl.saves)
        reasons = sorted({sv.skip_reason for r in ranks for sv in tl.saves[r] if sv.skip_reason})
        out.append(f"{len(s.skipped_steps)} save(s) skipped ({'; '.join(reasons)}): step {steps}")
    ranks = set(tl.saves)
    for step in s.skipped_steps:
        skipped_on = {
            sv.rank for r in ranks for sv in tl.saves[r] if sv.step == step and sv.skipped_at is not None
        }
        if skipped_on != ranks:  # skips are agreed collectively: a lone skip is a correctness bug
            out.append(f"step {step} skipped on rank(s) {sorted(skipped_on)} only: ranks disagreed")
    if s.failed_steps:
        kinds = sorted({sv.failed for r in ranks for sv in tl.saves[r] if sv.failed})
        out.append(f"{len(s.failed_steps)} save(s) failed ({', '.join(kinds)}): step {s.failed_steps}")
    return out


def _straggler(s: Summary) -> list[str]:
    flushes = {r.rank: r.median_flush_s for r in s.ranks if r.median_flush_s}
    if len(flushes) < 2:
        return []
    median = float(np.median(list(flushes.values())))
    rank, worst = max(flushes.items(), key=lambda kv: kv[1])
    if median > 0 and worst > 1.5 * median:
        return [
            f"rank {rank} flushes {worst / median:.1f}× slower than the median rank:"
            " a straggler gates commits"
        ]
    return []

