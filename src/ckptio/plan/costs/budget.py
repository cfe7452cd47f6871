"""The burst budget: what one checkpoint of a job costs on a given store, in closed form, and the verdict.

Owns the planner's answer (:class:`BurstBudget`) — blocking time of an async save, stall of a synchronous one, flush
time of the burst with every rank writing at once, whether the flush finishes before the next save, the overhead,
Young's and Daly's optimal intervals, the work lost per failure, each save mode's cost to the step — and the findings
its verdict rests on, each saying what to change. It composes :mod:`~ckptio.plan.costs.store` (the flush),
:mod:`~ckptio.plan.costs.intervals` (when saves happen) and :mod:`~ckptio.plan.costs.background` (each mode's cost).
It must never touch storage (profiles come from :mod:`ckptio.plan.measure.probe`) and never simulate time step by
step (that is :mod:`ckptio.plan.simulation`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ckptio.plan.costs.background import predict_modes
from ckptio.plan.costs.commit_metadata import CommitMetadata, commit_metadata, commit_shape
from ckptio.plan.costs.inputs import Host, Network, StoreTiming, Workload, WriterCosts
from ckptio.plan.costs.intervals import PlannedInterval, Schedule, daly_interval_s, planned_interval, young_interval_s
from ckptio.plan.costs.readback import durable_restore
from ckptio.plan.costs.sizing import JobSizes, job_sizes
from ckptio.plan.costs.store import FlushTimes, StoreLimits, bottleneck, flush_times, serialize_s
from ckptio.plan.job.checkpoint import CheckpointShape
from ckptio.plan.units import format_duration, format_rate

DEFAULT_KEEP_LAST = 3
"""Committed checkpoints kept, as the Checkpointer keeps them by default: retention's deletes are in every commit."""
OVERHEAD_WARN_FRACTION = 0.05
FLUSH_HEADROOM_WARN = 0.8
INTERVAL_WASTE_WARN = 0.01


@dataclass(kw_only=True, slots=True, frozen=True)
class BurstBudget(JobSizes):
    """The planner's answer for one job on one store (``ckptio plan --json`` prints exactly these keys), built once by
    :func:`plan_burst` with its verdict."""

    sync_stall_s: float
    """Time a synchronous save stalls training (copy + flush)."""
    flush_s: float
    """Time for the whole burst to reach storage, all ranks writing at once."""
    flush_data_s: float
    """Flush time from bandwidth alone."""
    flush_metadata_s: float
    """Flush time from metadata operations (POSIX) alone."""
    flush_requests_s: float
    """Flush time from the request-rate limit (object stores) alone."""
    bottleneck: str
    """What sets the flush time."""
    interval_s: float
    """Compute time between saves used for this plan."""
    interval_steps: int | None
    """The interval in steps, when a step time is known."""
    interval_source: str
    """``given`` or ``daly`` (no interval given: planned at the optimum)."""
    keeps_up: bool
    """The flush finishes before the next save (always true for sync saves: training waits)."""
    stall_s_per_checkpoint: float
    """Training time lost per checkpoint in steady state (blocking, plus waiting for a slot when behind)."""
    overhead_fraction: float
    """Share of wall time lost to checkpoint stalls."""
    checkpoint_cost_s: float
    """δ of Young and Daly: the per-checkpoint stall (or ``--save-cost``)."""
    mtbf_s: float
    """Mean time between interruptions used."""
    young_interval_s: float
    """Young's optimal interval."""
    optimal_interval_s: float
    """Daly's optimal interval."""
    expected_lost_work_s: float
    """Expected wall time redone after one failure (back to the newest committed checkpoint)."""
    waste_fraction: float
    """Checkpoint overhead plus expected rework, as a share of wall time."""
    gpu_hours_lost_per_day: float
    """``waste_fraction`` × ranks × 24 h."""
    storage_kind: str
    """posix or object."""
    put_requests_per_s: float
    """PUT-class requests per second the burst needs to flush at bandwidth speed (object stores)."""
    put_rate_limit: float
    """Request rate the prefixes sustain."""
    restore_s: dict[str, float | None]
    """Seconds to read one checkpoint back, per level, every rank restoring at once
    (:mod:`~ckptio.plan.costs.readback`; ``durable``: None when the read bandwidth is unknown). Levels other than
    ``durable`` join as they are planned."""
    metadata_ops: dict[str, dict[str, int]]
    """Storage operations of one save (``per_save``, every rank's writer) and of its commit (``per_commit``, rank 0's
    committer) by kind, as :func:`ckptio.format.commit_ops.commit_ops` counts them for the job's shape."""
    commit_metadata_s: float
    """Seconds of metadata work of one save and its commit at the store's rates (probed per kind, else given, else
    the default; :mod:`~ckptio.plan.costs.commit_metadata`); above the interval, the plan fails (warns, on the
    defaults)."""
    commit_metadata: dict[str, Any]
    """Its parts: ``save_s``, ``commit_s``, the ``rates`` used per metadata kind and their ``rates_source``."""
    commit_lag_s: float
    """``save()`` return → the step committed, when the flush keeps up: the flush, then rank 0's commit, which
    starts once every rank's data is written, its operations one after another (``commit_metadata.commit_s``).
    Saves that queue overlap one commit with the next save's data: their pace is ``flush_s``."""
    modes: dict[str, dict[str, Any]]
    """Per save mode (:data:`ckptio.plan.costs.background.MODES`): ``blocking_s``, ``background_cpu_s``, ``stolen_s``,
    ``flush_s``, ``step_inflation`` (None for a synchronous save) and ``lost_per_save_s``."""
    verdict: str
    """``ok``, ``warn`` (works, with a cost worth fixing) or ``fail`` (the store cannot take the burst)."""
    reasons: list[str] = field(default_factory=list)
    """Each finding behind the verdict, with what to change."""
    reason_codes: list[str] = field(default_factory=list)
    """A stable name per reason: flush-behind, metadata, metadata-unmeasured, flush-tight, stall, put-rate,
    interval."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan_burst(
    shape: CheckpointShape,
    storage: StoreLimits,
    schedule: Schedule,
    *,
    host: Host | None = None,
    costs: WriterCosts | None = None,
    network: Network | None = None,
    keep_last: int = DEFAULT_KEEP_LAST,
) -> BurstBudget:
    """The closed-form budget of ``shape``'s checkpoints on ``storage`` under ``schedule``; ``host`` and ``costs``
    feed the per-mode background cost (defaults: :class:`Host`, :class:`WriterCosts` with the store's measured
    serialize rate as ckptio's checksum rate), ``network`` the restore's exchange (default :class:`Network`),
    ``keep_last`` the commit's retention (its deletes are metadata work of every commit)."""
    network = network or Network()
    blocking = schedule.blocking_s(shape.bytes_per_rank_max)
    flush = flush_times(shape, storage)
    mtbf = schedule.mtbf_for(shape.ranks)
    # δ for Young/Daly: what one checkpoint costs the loop when the flush keeps up.
    cost = blocking if schedule.mode == "async" else blocking + flush.total_s
    optimal = daly_interval_s(cost, mtbf) if cost > 0 else mtbf
    interval = planned_interval(schedule, optimal)
    state = _steady_state(interval.seconds, blocking, flush.total_s, schedule.mode, mtbf)
    at_optimum = _steady_state(optimal, blocking, flush.total_s, schedule.mode, mtbf)
    metadata = commit_metadata(commit_shape(shape, keep_last=keep_last), storage)
    inputs = _Findings(
        shape=shape, storage=storage, mode=schedule.mode, flush_s=flush.total_s,
        bottleneck=bottleneck(shape, storage, flush), interval=interval, state=state, optimal_interval_s=optimal,
        cost_s=cost, mtbf_s=mtbf, put_requests_per_s=_put_requests_per_s(shape, flush), metadata=metadata,
        extra_waste=state.waste_fraction - at_optimum.waste_fraction,
    )
    findings = _findings(inputs)
    refused = not state.keeps_up or "metadata" in (code for code, _ in findings)
    return BurstBudget(
        **job_sizes(shape, schedule, blocking),
        **_flush_fields(shape, storage, flush, schedule),
        **_interval_fields(inputs),
        restore_s={"durable": _restore_s(shape, storage, network)},
        **_metadata_fields(metadata),
        commit_lag_s=flush.total_s + metadata.commit_s,
        modes=_mode_costs(shape, storage, flush, blocking_s=blocking, interval_s=interval.seconds,
                          overlap_s=schedule.overlap_s, host=host, costs=costs, network=network,
                          step_time_s=schedule.step_time_s),
        verdict="fail" if refused else ("warn" if findings else "ok"),
        reasons=[message for _, message in findings],
        reason_codes=[code for code, _ in findings],
    )


def _put_requests_per_s(shape: CheckpointShape, flush: FlushTimes) -> float:
    """PUT-class requests a second the burst issues when it flushes as fast as bandwidth and metadata allow."""
    return shape.requests / max(flush.data_s, flush.metadata_s, 1e-9)


def _flush_fields(shape: CheckpointShape, storage: StoreLimits, flush: FlushTimes,
                  schedule: Schedule) -> dict[str, Any]:
    """The budget's flush keys: how long the burst takes to reach the store, and what limits it."""
    return {"sync_stall_s": schedule.blocking_s(shape.bytes_per_rank_max) + flush.total_s,
            "flush_s": flush.total_s, "flush_data_s": flush.data_s, "flush_metadata_s": flush.metadata_s,
            "flush_requests_s": flush.requests_s, "bottleneck": bottleneck(shape, storage, flush),
            "storage_kind": storage.kind, "put_requests_per_s": _put_requests_per_s(shape, flush),
            "put_rate_limit": storage.request_rate_limit}


def _interval_fields(f: _Findings) -> dict[str, Any]:
    """The budget's schedule keys: the interval, the steady state at it, and the optimal intervals."""
    state, interval = f.state, f.interval
    return {"interval_s": interval.seconds, "interval_steps": interval.steps, "interval_source": interval.source,
            "keeps_up": state.keeps_up, "stall_s_per_checkpoint": state.stall_s,
            "overhead_fraction": state.overhead_fraction, "checkpoint_cost_s": f.cost_s, "mtbf_s": f.mtbf_s,
            "young_interval_s": young_interval_s(f.cost_s, f.mtbf_s), "optimal_interval_s": f.optimal_interval_s,
            "expected_lost_work_s": state.lost_s, "waste_fraction": state.waste_fraction,
            "gpu_hours_lost_per_day": state.waste_fraction * f.shape.ranks * 24.0}


def _metadata_fields(metadata: CommitMetadata) -> dict[str, Any]:
    out = metadata.to_json()
    return {"metadata_ops": out["metadata_ops"], "commit_metadata_s": out["commit_metadata_s"],
            "commit_metadata": out["commit_metadata"]}


def _mode_costs(shape: CheckpointShape, storage: StoreLimits, flush: FlushTimes, *, blocking_s: float,
                interval_s: float, overlap_s: float | None, host: Host | None,
                costs: WriterCosts | None, network: Network, step_time_s: float | None) -> dict[str, dict[str, Any]]:
    """The background model's per-mode costs for the largest rank, its device copy ``blocking_s``, a side-stream
    copy running beside ``overlap_s`` of the next step, its bytes leaving through ``network``'s NIC beside the
    collectives of ``step_time_s`` steps."""
    if costs is None:
        costs = WriterCosts()
        if math.isfinite(storage.serialize_bytes_per_s):  # the probe's figure: ckptio's framing + crc32c
            costs = replace(costs, checksum_bytes_per_s=storage.serialize_bytes_per_s)
    # The store's own part of the flush: the writers' CPU is the background model's to place.
    store = StoreTiming(store_s=max(flush.data_s - serialize_s(shape, storage), flush.metadata_s, flush.requests_s))
    workload = Workload(bytes_per_rank=shape.bytes_per_rank_max, interval_s=interval_s, device_copy_s=blocking_s,
                        overlap_s=overlap_s, dtensor_share=shape.dtensor_share, lockstep_ranks=max(1, shape.ranks),
                        nic_share=network.collective_share(step_time_s),
                        nic_bytes_per_s=network.bytes_per_s / network.ranks_per_node)
    modes = predict_modes(workload, store, host=host, costs=costs)
    return {name: cost.to_json() for name, cost in modes.items()}


@dataclass(kw_only=True, slots=True, frozen=True)
class _SteadyState:
    stall_s: float
    keeps_up: bool
    lost_s: float
    overhead_fraction: float
    waste_fraction: float


def _steady_state(interval: float, blocking: float, flush: float, mode: str, mtbf: float) -> _SteadyState:
    """Per-cycle cost of saving every ``interval`` seconds of compute."""
    if mode == "sync":
        stall, keeps_up, commit_delay = blocking + flush, True, blocking + flush
    else:
        # With one staging slot, a save that finds the previous flush still running waits for it.
        stall, keeps_up, commit_delay = (
            blocking + max(0.0, flush - interval),
            flush <= interval,
            blocking + flush,
        )
    cycle = interval + stall
    # Failure time is uniform over a cycle; until the newest save commits, the one before it is what restarts.
    lost = cycle / 2.0 + min(commit_delay, cycle)
    overhead = stall / cycle
    return _SteadyState(
        stall_s=stall,
        keeps_up=keeps_up,
        lost_s=lost,
        overhead_fraction=overhead,
        waste_fraction=min(overhead + lost / mtbf, 1.0),
    )


@dataclass(kw_only=True, slots=True, frozen=True)
class _Findings:
    """What the findings read, before the budget that reports them exists."""

    shape: CheckpointShape
    storage: StoreLimits
    mode: str
    flush_s: float
    bottleneck: str
    interval: PlannedInterval
    state: _SteadyState
    optimal_interval_s: float
    cost_s: float
    mtbf_s: float
    put_requests_per_s: float
    metadata: CommitMetadata
    extra_waste: float
    """Waste at the planned interval beyond the waste at Daly's optimum."""


def _findings(f: _Findings) -> list[tuple[str, str]]:
    """Every problem of the plan as ``(code, message)``, each message saying what to change."""
    out: list[tuple[str, str]] = []
    flush_s, interval_s, state = f.flush_s, f.interval.seconds, f.state
    if not state.keeps_up:
        need = f.shape.total_bytes / interval_s
        out.append((
            "flush-behind",
            f"flush takes {format_duration(flush_s)} but saves come every {format_duration(interval_s)}: "
            f"the {f.bottleneck} limits it; give the store at least {format_rate(need)} of write bandwidth "
            f"or save at least {format_duration(flush_s)} apart",
        ))
    elif f.mode == "async" and flush_s > FLUSH_HEADROOM_WARN * interval_s:
        out.append((
            "flush-tight",
            f"flush uses {flush_s / interval_s:.0%} of the interval ({format_duration(flush_s)} of "
            f"{format_duration(interval_s)}): one slow save and the next one waits; keep it under "
            f"{FLUSH_HEADROOM_WARN:.0%} with a longer interval or more bandwidth",
        ))
    out.extend(_metadata_finding(f))
    if state.keeps_up and state.overhead_fraction > OVERHEAD_WARN_FRACTION:
        fix = "use async saves (ckptio)" if f.mode == "sync" else "lengthen the interval or speed up the copy"
        out.append((
            "stall",
            f"checkpoints stall training {format_duration(state.stall_s)} per save, "
            f"{state.overhead_fraction:.1%} of wall time: {fix}",
        ))
    limit = f.storage.request_rate_limit
    if f.storage.kind == "object" and f.put_requests_per_s > limit:
        out.append((
            "put-rate",
            f"the burst needs {f.put_requests_per_s:,.0f} PUT/s against {limit:,.0f}/s for "
            f"{f.storage.prefixes} prefix(es): spread ranks over more prefixes or use larger files and parts",
        ))
    if f.interval.source == "given" and f.extra_waste > INTERVAL_WASTE_WARN:
        side = "longer" if interval_s > f.optimal_interval_s else "shorter"
        out.append((
            "interval",
            f"the interval wastes {f.extra_waste:.1%} more GPU time than Daly's optimum of "
            f"{format_duration(f.optimal_interval_s)} (cost {format_duration(f.cost_s)}, "
            f"MTBF {format_duration(f.mtbf_s)}): save {side} apart",
        ))
    return out


def _metadata_finding(f: _Findings) -> list[tuple[str, str]]:
    """A save and its commit whose metadata work alone outlasts the interval: the commits fall behind the saves
    whatever the bandwidth (the writer's queue grows until saves block or are skipped), so on the store's own rates
    the plan fails (``metadata``); on the built-in defaults it warns (``metadata-unmeasured``), since the store
    may be far faster than the default."""
    m, interval_s = f.metadata, f.interval.seconds
    if m.total_s <= interval_s:
        return []
    per_save, per_commit = sum(m.ops.per_save.values()), sum(m.ops.per_commit.values())
    fix = ("write fewer, larger files per rank, keep fewer checkpoints, use a store with a faster metadata service "
           f"or save at least {format_duration(m.total_s)} apart" if m.measured else
           "probe the store (`ckptio probe --out`, then --profile) or give --metadata-ops to judge it")
    return [(
        "metadata" if m.measured else "metadata-unmeasured",
        f"metadata operations of a save and its commit take {format_duration(m.total_s)} at {m.rates_source} "
        f"rates ({per_save:,} storage operations per save, {per_commit:,} per commit) but saves come every "
        f"{format_duration(interval_s)}: {fix}",
    )]


def _restore_s(shape: CheckpointShape, storage: StoreLimits, network: Network) -> float | None:
    restore = durable_restore(shape, storage, network)
    return restore.total_s if restore else None
