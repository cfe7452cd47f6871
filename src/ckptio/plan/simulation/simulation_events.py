"""A simulation told in ckptio's event schema, so ``ckptio report`` draws it like a real run.

Owns the translation of a :class:`~ckptio.plan.simulation.burst_types.SimulationResult` into JSONL event records
(:mod:`ckptio.obs.events`): one representative rank per rank class (``rank`` = class index), its save
requests, returns, skips, writer phases and commits, and — when a step time is known — its training steps.
Must never invent an event the schema does not list, nor write more than ``max_records`` lines (a long
simulation at thousands of steps per save would drown the picture; steps are dropped first).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from ckptio.obs.events import Event, Phase, make_record
from ckptio.plan.job.checkpoint import CheckpointShape
from ckptio.plan.simulation.burst_types import CheckpointRecord, SimulationResult

MAX_RECORDS = 200_000
_TIERS: dict[str, str] = {Phase.LOCAL_WRITE: "local", Phase.UPLOAD: "durable"}


def simulation_events(
    result: SimulationResult,
    shape: CheckpointShape,
    *,
    step_time_s: float | None = None,
    max_records: int = MAX_RECORDS,
) -> list[dict[str, Any]]:
    """Event records of ``result`` in time order (simulated seconds serve as both ``ts`` and ``mono``)."""
    reps = range(len(shape.classes))
    records = [r for rec in result.records for rank in reps for r in _save_events(result, rec, rank, shape)]
    if step_time_s:
        steps = list(_step_events(result, step_time_s, reps, budget=max_records - len(records)))
        records.extend(steps)
    records = records[:max_records]
    records.sort(key=lambda r: (r["mono"], r["rank"]))
    return records


def write_events(records: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")


def _event(
    t: float, rank: int, event: Event, step: int | None, role: str = "trainer", **fields: Any
) -> dict[str, Any]:
    return make_record(event, step, rank=rank, role=role, ts=t, mono=t, **fields)


def _save_events(
    result: SimulationResult, record: CheckpointRecord, rank: int, shape: CheckpointShape
) -> Iterator[dict[str, Any]]:
    step, nbytes = record.index, int(shape.classes[rank].bytes)
    yield _event(record.requested_s, rank, Event.SAVE_REQUESTED, step)
    if record.skipped:
        yield _event(
            record.requested_s,
            rank,
            Event.SAVE_SKIPPED,
            step,
            reason="no free staging slot",
            pending=record.queue_depth,
        )
        return
    # A synchronous save returns only once the flush is durable: all of it is blocking.
    returned = record.requested_s + record.stall_s
    yield _event(returned, rank, Event.SAVE_RETURNED, step, blocking_s=record.stall_s, bytes=nbytes)
    for cls, phase, start, end in record.phases:
        if cls == rank:
            yield _event(
                end,
                rank,
                Event.PHASE,
                step,
                role="writer",
                phase=phase,
                seconds=end - start,
                bytes=nbytes,
                tier=_TIERS[phase],
            )
    if record.committed_s is not None:
        previous = result.records[step - 1].requested_s if step else None
        interval = None if previous is None else record.requested_s - previous
        yield _event(
            record.committed_s,
            rank,
            Event.COMMITTED,
            step,
            role="writer",
            flush_s=record.committed_s - returned,
            lag_s=record.lag_s,
            interval_s=interval,
            bytes=nbytes,
        )


def _step_events(
    result: SimulationResult, step_time_s: float, reps: range, *, budget: int
) -> Iterator[dict[str, Any]]:
    """``step_end`` events from the compute segments: a step ends each ``step_time_s`` of compute."""
    ends = list(_step_ends(result.compute_segments, step_time_s))
    if len(ends) * len(reps) > budget:
        reps = reps[:1] if len(ends) <= budget else range(0)
    for index, (end, seconds) in enumerate(ends):
        for rank in reps:
            yield _event(end, rank, Event.STEP_END, index, seconds=seconds)


def _step_ends(
    segments: list[tuple[float, float, float]], step_time_s: float
) -> Iterator[tuple[float, float]]:
    """``(end time, wall seconds)`` of each step; a step paused by a save spans the pause."""
    done, started = 0.0, segments[0][0] if segments else 0.0
    for start, end, rate in segments:
        t = start
        while rate > 0 and t < end:
            finish = t + (step_time_s - done) / rate
            if finish > end + 1e-9:
                done += (end - t) * rate
                break
            yield finish, finish - started
            t, done, started = finish, 0.0, finish
