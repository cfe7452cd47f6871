"""The report: what checkpoints cost a run, computed from its JSONL events and drawn as a timeline.

Owns reading event files (a bad line is a named error with file and line), attributing every training step
(blocked by staging, overlapped a background flush, or neither), the summary numbers and verdicts, and
rendering them as a PNG (matplotlib, Agg) or an HTML page holding the picture and the table. It must never
touch a checkpoint or its storage: everything it says comes from the events.

Definitions (the docs and tests rely on them):

* A step is ``staging`` if it overlaps (by > 1 µs) a ``save()`` call on its rank (save_requested →
  save_returned/skipped), else ``flush`` if it overlaps a background flush (save_returned →
  committed/save_failed, or the end of the log), else ``clean``.
* Seconds lost on a rank = Σ ``save_returned.blocking_s`` + contention, where contention = max(0, Σ over
  flush steps of (step − median clean step)). Ranks run in lockstep, so the job loses the max over ranks,
  not the sum.
* Flush throughput of a rank = Σ committed bytes ÷ Σ ``flush_s``; the job's = Σ bytes of all ranks ÷ Σ over
  saves of the slowest rank's ``flush_s`` (the burst bandwidth the store delivered).
* Flush lag of a save = the largest ``committed.lag_s`` over ranks; its growth is the least-squares slope of
  lag against save index.
"""

from __future__ import annotations

import bisect
import glob
import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ckptio.errors import ConfigError, CorruptCheckpointError
from ckptio.obs.events import EVENTS, Event

__all__ = [
    "RankSummary",
    "SaveTrace",
    "StepSample",
    "Summary",
    "Timeline",
    "build_timeline",
    "expand_event_paths",
    "load_events",
    "summarize",
    "summary_to_json",
    "write_report",
]

_REQUIRED = ("ts", "mono", "rank", "event")


# ------------------------------------------------------------------------------------------ loading
def expand_event_paths(paths: list[str] | tuple[str, ...]) -> list[str]:
    """Files for the given paths: a file as is, a directory's ``*.jsonl``, or an ``events_path`` as configured
    (``run/events.jsonl`` finds ``run/events.rank*.jsonl``; ``{rank}`` matches every rank)."""
    found: list[str] = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        if os.path.isdir(path):
            pattern = os.path.join(path, "*.jsonl")
        elif "{rank}" in path:
            pattern = path.replace("{rank}", "*")
        else:
            root, ext = os.path.splitext(path)
            pattern = f"{glob.escape(root)}.rank*{ext or '.jsonl'}"
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise ConfigError(f"no event file at {path!r} (also looked for {pattern!r})", path=path)
        found.extend(matches)
    return list(dict.fromkeys(found))


def load_events(paths: list[str] | tuple[str, ...] | str) -> list[dict[str, Any]]:
    """All events of the given files, ordered by rank then monotonic time; identical records are kept once.

    Raises :class:`CorruptCheckpointError` naming the file and line for a line that is not a JSON object
    with ``ts``/``mono``/``rank``/``event``, or that was cut short (a crash mid-write). Unknown event
    names are skipped: a newer writer's log stays readable.
    """
    files = expand_event_paths([paths] if isinstance(paths, str) else list(paths))
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    for path in files:
        for record in _read_file(path):
            key = json.dumps(record, sort_keys=True)
            if key not in seen:
                seen.add(key)
                records.append(record)
    records.sort(key=lambda r: (r["rank"], r["mono"]))
    return records


def _read_file(path: str) -> list[dict[str, Any]]:
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    records = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        truncated = number == len(lines)  # the last line has no newline: its writer died mid-append
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            what = "truncated line (no newline; the writer stopped mid-append)" if truncated else "not JSON"
            raise CorruptCheckpointError(f"bad event file: line {number}: {what}: {exc}", path=path) from exc
        problem = _problem(record)
        if problem:
            raise CorruptCheckpointError(f"bad event file: line {number}: {problem}", path=path)
        if record["event"] in EVENTS:
            records.append(record)
    return records


def _problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    missing = [key for key in _REQUIRED if key not in record]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    if not isinstance(record["rank"], int) or not all(
        isinstance(record[k], int | float) for k in ("ts", "mono")
    ):
        return "rank must be an int and ts/mono numbers"
    return None


# ------------------------------------------------------------------------------------------ timeline
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
    """``staging``, ``flush`` or ``clean`` (see the module docstring)."""


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


# ------------------------------------------------------------------------------------------ summary
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
    """Σ (flush step − median clean step), floored at 0."""
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
    """What checkpoints cost the run: see the module docstring for each definition."""

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
    """Job flush throughput (see module docstring)."""
    median_interval_s: float | None
    """Median time between save requests."""
    lags: list[tuple[int, float]]
    """(step, flush lag) per committed save."""
    median_lag_s: float | None
    """Median flush lag."""
    lag_growth_s_per_save: float | None
    """Least-squares slope of lag against save index (needs 3 saves)."""
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
    clean_median = float(np.median(by_kind["clean"])) if by_kind["clean"] else None
    contention = 0.0 if clean_median is None else max(0.0, sum(v - clean_median for v in by_kind["flush"]))
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


# ------------------------------------------------------------------------------------------ rendering
def write_report(records: list[dict[str, Any]], out: str, *, title: str | None = None) -> Summary:
    """Summarize ``records`` and write ``out``: ``.png`` (the timeline) or ``.html`` (timeline and table)."""
    from ckptio.obs import render  # matplotlib is optional (the ``report`` extra): import it only to draw

    ext = os.path.splitext(out)[1].lower()
    if ext not in (".png", ".html", ".htm"):
        raise ConfigError(f"report output must end in .png or .html, got {out!r}", path=out)
    timeline = build_timeline(records)
    summary = summarize(records, timeline)
    if ext == ".png":
        render.write_png(timeline, summary, out, title=title)
    else:
        render.write_html(timeline, summary, out, title=title)
    return summary
