"""What the lab's ranks printed, turned into the figures the cluster demo shows beside the planner's.

Definitions (the same as bench/README.md's):

- **lost per save**: (the save step plus the steps after it, up to the next save) − as many clean steps, where a
  clean step is the median step of the calm phase before any save; the median over saves, the mean over ranks
  (ranks in lockstep through the all-reduce lose alike);
- **flush**: from the first rank's request to the last rank's durable record, per save (the whole job's burst);
  the median over the saves that went to the durable store;
- **lag to durability**: request → durable on one rank; the largest over ranks and saves;
- **loader**: each node's loader rate while any rank's save was in flight, against its rate in the calm phase;
- **all-reduce**: the median all-reduce of steps during which a save was in flight on any rank, against the
  calm phase's median; the slowdown is their ratio − 1;
- **recovery**: wall time from the kill to each phase boundary of the resumed ranks (the slowest rank).

Pure functions of the records: nothing here starts, waits or prints.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

RECOVERY_PHASES = ("relaunch", "process start", "import", "process group", "Checkpointer", "restore", "first step")
"""The breakdown of a recovery, in order: each phase ends at the boundary its rank record names."""
_BOUNDARIES = ("launched", "started", "imported", "process_group", "checkpointer", "restore", "first_step")


@dataclass(frozen=True, slots=True)
class TrainFigures:
    """The figures of one training run (one saver on one store)."""

    lost_per_save_s: float
    flush_s: float | None
    lag_max_s: float | None
    clean_step_s: float
    allreduce_calm_s: float
    allreduce_saving_s: float | None
    loader_calm_mbit: list[float]
    loader_saving_mbit: list[float]
    saves: int

    @property
    def allreduce_slowdown(self) -> float | None:
        if self.allreduce_saving_s is None or self.allreduce_calm_s <= 0:
            return None
        return self.allreduce_saving_s / self.allreduce_calm_s - 1.0


@dataclass(frozen=True, slots=True)
class RecoveryFigures:
    """Kill → first resumed step, by phase (the slowest rank's boundaries), and where the bytes came from."""

    phases: dict[str, float]
    total_s: float
    restored_step: int | None
    sources: dict[str, int] = field(default_factory=dict)
    level: str = ""


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def train_figures(records: list[dict[str, Any]], loaders: list[list[dict[str, float]]], *, every: int,
                  durable: set[int] | None = None) -> TrainFigures:
    """The figures of a run from its ranks' ``result`` records; ``durable``: the steps that went to the durable
    store (None: every save)."""
    clean = statistics.median(c["s"] for r in records for c in r["calm"])
    lost = [_lost(r, every, clean) for r in records]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        for s in r["saves"]:
            by_step.setdefault(s["step"], []).append(s)
    flushes: list[float] = []
    lags: list[float] = []
    for step, saves in by_step.items():
        done = [s["durable"] for s in saves if s["durable"] is not None]
        if len(done) == len(saves) and (durable is None or step in durable):
            flushes.append(max(done) - min(s["requested"] for s in saves))
            lags.extend(s["durable"] - s["requested"] for s in saves)
    windows = _windows(records)
    flying = {step["step"] for r in records for step in r["steps"] if step["in_flight"]}
    calm = calm_span(records)
    return TrainFigures(
        lost_per_save_s=statistics.fmean(x for x in lost if x is not None) if any(x is not None for x in lost) else 0.0,
        flush_s=_median(flushes), lag_max_s=max(lags) if lags else None, clean_step_s=clean,
        allreduce_calm_s=statistics.median(c["reduce_s"] for r in records for c in r["calm"]),
        allreduce_saving_s=_median([s["reduce_s"] for r in records for s in r["steps"] if s["step"] in flying]),
        loader_calm_mbit=[_rate(samples, [calm]) for samples in loaders],
        loader_saving_mbit=[_rate(samples, windows) for samples in loaders],
        saves=len(by_step),
    )


def queued_flush_s(records: list[dict[str, Any]]) -> float | None:
    """The store's time per save while saves queue: the median gap between consecutive saves' last durable
    records (saves that never went durable end the sequence)."""
    last: dict[int, float] = {}
    for r in records:
        for s in r["saves"]:
            if s["durable"] is None:
                last[s["step"]] = float("inf")
            else:
                last[s["step"]] = max(last.get(s["step"], 0.0), s["durable"])
    done = [last[step] for step in sorted(last)]
    done = done[:done.index(float("inf"))] if float("inf") in done else done
    return _median([b - a for a, b in itertools.pairwise(done)])


def calm_span(records: list[dict[str, Any]]) -> tuple[float, float]:
    """The wall-time span in which every rank was in its calm phase."""
    return max(r["calm_span"][0] for r in records), min(r["calm_span"][1] for r in records)


def saving_span(records: list[dict[str, Any]]) -> tuple[float, float]:
    """First save requested → the last durable record (or the last step, for a save that never went durable)."""
    began = min((s["requested"] for r in records for s in r["saves"]), default=0.0)
    ended = max(s["durable"] if s["durable"] is not None else r["steps"][-1]["t"] for r in records for s in r["saves"])
    return began, ended


def _lost(record: dict[str, Any], every: int, clean: float) -> float | None:
    steps = {s["step"]: s["s"] for s in record["steps"]}
    per_save = []
    for save in record["saves"]:
        span = [steps.get(save["step"] + k) for k in range(every)]
        if all(x is not None for x in span):
            per_save.append(sum(x for x in span if x is not None) - every * clean)
    return _median(per_save)


def _windows(records: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The wall-time spans during which some rank's save was in flight (request → durable)."""
    spans = []
    for r in records:
        end_of_run = r["steps"][-1]["t"]
        for s in r["saves"]:
            spans.append((s["requested"], s["durable"] if s["durable"] is not None else end_of_run))
    return spans


def _rate(samples: list[dict[str, float]], spans: list[tuple[float, float]]) -> float:
    """Mean rate of the samples that end inside one of ``spans`` (0 when none do)."""
    inside = [s["mbit"] for s in samples if any(a <= s["t"] <= b for a, b in spans)]
    return statistics.fmean(inside) if inside else 0.0


def recovery_figures(killed: float, relaunched: float, ranks: list[dict[str, Any]]) -> RecoveryFigures:
    """Phase durations from the kill: the relaunch (kill, wipe, remount, end of the old job, new processes
    spawned), then each of the slowest rank's boundaries."""
    boundaries = [relaunched] + [max(r["times"][b] for r in ranks) for b in _BOUNDARIES[1:]]
    phases, previous = {}, killed
    for name, at in zip(RECOVERY_PHASES, boundaries, strict=True):
        phases[name] = max(0.0, at - previous)
        previous = max(previous, at)
    sources: dict[str, int] = {}
    for r in ranks:
        for where, count in r.get("sources", {}).items():
            sources[where] = sources.get(where, 0) + count
    steps = [r["step"] for r in ranks if r.get("step") is not None]
    return RecoveryFigures(phases=phases, total_s=previous - killed,
                           restored_step=min(steps) if len(steps) == len(ranks) else None, sources=sources,
                           level="/".join(sorted({r.get("level", "") for r in ranks})))


@dataclass(frozen=True, slots=True)
class PacingFigures:
    """How a run's paces were applied, from its ranks' event logs (what the writers did, not what they were told).

    ``partner_bytes_per_s``: each partner copy's bytes ÷ seconds (the ``replicate`` phase; copies the next save
    hurried count in full); ``flush_*``: the ``flush_paced`` events' target and achieved rates; ``hurried``: the
    paced flushes that went to full speed before their end (a later save, an emergency save, ``close()``)."""

    partner_bytes_per_s: list[float]
    flush_target_bytes_per_s: list[float]
    flush_achieved_bytes_per_s: list[float]
    hurried: int

    @property
    def paced_flushes(self) -> int:
        return len(self.flush_target_bytes_per_s)


def pacing_figures(events: list[dict[str, Any]]) -> PacingFigures:
    """The paces applied, from the event records of every rank of a run."""
    partner = [e["bytes"] / e["seconds"] for e in events
               if e.get("event") == "phase" and e.get("phase") == "replicate" and e.get("bytes") and e.get("seconds")]
    paced = [e for e in events if e.get("event") == "flush_paced"]
    return PacingFigures(partner_bytes_per_s=partner,
                         flush_target_bytes_per_s=[e["target_bytes_per_s"] for e in paced],
                         flush_achieved_bytes_per_s=[e["achieved_bytes_per_s"] for e in paced],
                         hurried=sum(bool(e.get("hurried")) for e in paced))
