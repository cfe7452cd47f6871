"""A run's events paired into steps and saves per rank on one time axis, each step attributed.

Owns the pairing (save_requested → save_returned → committed, writer phases, step_end) and the step
attribution defined in :mod:`ckptio.obs.report` (``staging``, ``flush`` or ``clean``). Must never read files
(``obs.eventfiles`` does) nor compute the summary numbers (``obs.summary`` does).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckptio.obs.events import Event

__all__ = ["SaveTrace", "StepSample", "Timeline", "build_timeline"]


@dataclass(kw_only=True, slots=True)
class SaveTrace:
    """One save on one rank, times in seconds since the start of the run (aligned across ranks)."""

    rank: int
    """Global rank."""
    step: int
    """Checkpoint step."""
    requested: float | None = None
    """save() called."""
    returned: float | None = None
    """save() returned (staging done)."""
    skipped_at: float | None = None
    """All ranks agreed to skip this save."""
    skip_reason: str | None = None
    """save_skipped.reason."""
    committed: float | None = None
    """This rank saw the step committed."""
    failed: str | None = None
    """Error type of a failed save."""
    failed_at: float | None = None
    """When the failure was recorded."""
    blocking_s: float = 0.0
    """save_returned.blocking_s."""
    flush_s: float | None = None
    """committed.flush_s."""
    lag_s: float | None = None
    """committed.lag_s."""
    interval_s: float | None = None
    """committed.interval_s."""
    bytes: int = 0
    """Checkpoint bytes of this rank (committed.bytes, else save_returned.bytes)."""
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    """Writer phases as (name, start, end)."""
    pace_target_Bps: float | None = None
    """The durable flush's paced rate (flush_paced.target_bytes_per_s); None: not paced."""
    pace_stretched_s: float = 0.0
    """How long the pace held the durable flush back (flush_paced.stretched_s)."""

    @property
    def flush_end(self) -> float | None:
        return self.committed if self.committed is not None else self.failed_at


@dataclass(kw_only=True, slots=True)
class StepSample:
    """One training step on one rank."""

    rank: int
    """Global rank."""
    step: int | None
    """Training step number."""
    start: float
    """Start, seconds since the start of the run."""
    seconds: float
    """Duration."""
    kind: str = "clean"
    """``staging``, ``flush`` or ``clean`` (see :mod:`ckptio.obs.report`)."""


@dataclass(kw_only=True, slots=True)
class Timeline:
    """Steps and saves per rank on one time axis."""

    steps: dict[int, list[StepSample]]
    """Per rank, in time order."""
    saves: dict[int, list[SaveTrace]]
    """Per rank, in request order."""
    end: dict[int, float]
    """Per rank, time of its last event."""
    retries: int = 0
    """Retry events seen."""
    writer_deaths: int = 0
    """writer_died events seen."""


def build_timeline(records: list[dict[str, Any]]) -> Timeline:
    """Pair the events into steps and saves. Each rank's monotonic clock is shifted by its median (ts − mono):
    durations keep monotonic precision while ranks on different hosts line up by wall clock."""
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_rank[record["rank"]].append(record)
    offsets = {rank: float(np.median([r["ts"] - r["mono"] for r in rs])) for rank, rs in by_rank.items()}
    t0 = min((r["mono"] + offsets[rank] for rank, rs in by_rank.items() for r in rs), default=0.0)
    timeline = Timeline(steps={}, saves={}, end={})
    for rank, rs in sorted(by_rank.items()):
        shift = offsets[rank] - t0
        steps, saves = _pair_rank(rank, sorted(rs, key=lambda r: r["mono"]), shift, timeline)
        timeline.steps[rank], timeline.saves[rank] = steps, saves
        timeline.end[rank] = rs[-1]["mono"] + shift
        _attribute(steps, saves, timeline.end[rank])
    return timeline


def _pair_rank(
    rank: int, records: list[dict[str, Any]], shift: float, timeline: Timeline
) -> tuple[list[StepSample], list[SaveTrace]]:
    steps: list[StepSample] = []
    saves: list[SaveTrace] = []
    open_saves: dict[int, SaveTrace] = {}

    def trace(step: int) -> SaveTrace:
        if step not in open_saves:  # the log began mid-save: keep what it shows
            open_saves[step] = SaveTrace(rank=rank, step=step)
            saves.append(open_saves[step])
        return open_saves[step]

    for r in records:
        event, step, t = r["event"], r.get("step"), r["mono"] + shift
        if event == Event.STEP_END and r.get("seconds") is not None:
            steps.append(
                StepSample(rank=rank, step=step, start=t - float(r["seconds"]), seconds=float(r["seconds"]))
            )
        elif event == Event.RETRY:
            timeline.retries += 1
        elif event == Event.WRITER_DIED:
            timeline.writer_deaths += 1
        elif step is None:
            continue
        elif event == Event.SAVE_REQUESTED:
            open_saves[step] = SaveTrace(rank=rank, step=step, requested=t)
            saves.append(open_saves[step])
        elif event == Event.SAVE_RETURNED:
            s = trace(step)
            s.returned, s.blocking_s, s.bytes = t, float(r.get("blocking_s") or 0.0), int(r.get("bytes") or 0)
        elif event == Event.SAVE_SKIPPED:
            s = trace(step)
            s.skipped_at, s.skip_reason = t, str(r.get("reason") or "skipped")
        elif event == Event.SAVE_FAILED:
            s = trace(step)
            s.failed, s.failed_at = str(r.get("error_type") or "error"), t
        elif event == Event.PHASE:
            seconds = float(r.get("seconds") or 0.0)
            trace(step).phases.append((str(r.get("phase")), t - seconds, t))
        elif event == Event.FLUSH_PACED and r.get("tier", "durable") == "durable":
            s = trace(step)
            s.pace_target_Bps, s.pace_stretched_s = _num(r.get("target_bytes_per_s")), _num(r.get("stretched_s")) or 0.0
        elif event == Event.COMMITTED and trace(step).committed is None:
            s = trace(step)
            s.committed, s.flush_s, s.lag_s = t, _num(r.get("flush_s")), _num(r.get("lag_s"))
            s.interval_s = _num(r.get("interval_s"))
            s.bytes = int(r.get("bytes") or s.bytes)
    return steps, saves


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _attribute(steps: list[StepSample], saves: list[SaveTrace], end: float) -> None:
    staging = _Spans([(s.requested, s.returned or s.skipped_at) for s in saves])
    flushing = _Spans([(s.returned, s.flush_end or end) for s in saves if s.skipped_at is None])
    for sample in steps:
        a, b = sample.start, sample.start + sample.seconds
        if staging.overlaps(a, b):
            sample.kind = "staging"
        elif flushing.overlaps(a, b):
            sample.kind = "flush"


# Events that touch (a save returning exactly as the next step begins) must not count as overlapping because
# of float rounding in the clock alignment: an overlap has to exceed a microsecond.
_OVERLAP_EPS_S = 1e-6


class _Spans:
    """Time spans sorted by start, asked "does [a, b] overlap any?" for every step: a bisection, then a short
    scan back (no span is longer than the longest), so 10⁵ steps against 10³ saves stay fast."""

    def __init__(self, spans: list[tuple[float | None, float | None]]) -> None:
        known = sorted((lo, hi) for lo, hi in spans if lo is not None and hi is not None)
        self.starts = [lo for lo, _ in known]
        self.spans = known
        self.longest = max((hi - lo for lo, hi in known), default=0.0)

    def overlaps(self, a: float, b: float) -> bool:
        i = bisect.bisect_left(self.starts, b) - 1
        while i >= 0 and self.starts[i] >= a - self.longest - _OVERLAP_EPS_S:
            lo, hi = self.spans[i]
            if min(b, hi) - max(a, lo) > _OVERLAP_EPS_S:
                return True
            i -= 1
        return False

