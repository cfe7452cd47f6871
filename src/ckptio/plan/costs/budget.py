"""The burst budget: what one checkpoint of a job costs on a given store, in closed form.

Owns the planner's answers — blocking time of an async save, stall of a synchronous one, flush time of the
burst with every rank writing at once, whether the flush finishes before the next save, the overhead, Young's
and Daly's optimal intervals and the work lost per failure — and the verdict built from them. It must never
touch storage (profiles come from :mod:`ckptio.plan.measure.probe`) and never simulate time step by step (that is
``simulate``).

The flush is a bottleneck model: bytes move at the max-min fair share of the aggregate bandwidth, each writer
capped at its own bandwidth (:func:`~ckptio.plan.costs.fairshare.fair_share_flush_s`); objects cost metadata
operations (POSIX) or PUT-class requests (object stores, per-prefix limit); the slowest of the three sets the
flush time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ckptio.errors import ConfigError
from ckptio.plan.costs.background import HostModel, WriterCosts, predict_modes
from ckptio.plan.costs.fairshare import fair_share_flush_s
from ckptio.plan.job.checkpoint import CheckpointShape
from ckptio.plan.units import format_duration, format_rate

# Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 GPUs ("The Llama 3 Herd of
# Models", Meta, 2024). Scaled per GPU, it gives a default MTBF for a job of any size: failures grow with the
# number of GPUs a job holds.
LLAMA3_GPU_SECONDS_PER_FAILURE = 16384 * 54 * 86400 / 419
S3_PUT_RATE_PER_PREFIX = 3500.0
"""PUT/COPY/POST/DELETE requests per second per partitioned prefix (AWS S3 documentation)."""
METADATA_OPS_PER_OBJECT = 2
"""A POSIX object costs a create (temp file) and a rename/link (atomic publish)."""
DEFAULT_D2H_BYTES_PER_S = 20e9
"""Pinned device-to-host copy over PCIe 4.0 x16 runs at about 20–25 GB/s; 20 GB/s is the cautious default."""
OVERHEAD_WARN_FRACTION = 0.05
FLUSH_HEADROOM_WARN = 0.8
INTERVAL_WASTE_WARN = 0.01
_POSITIVE_RATES = (
    "write_bytes_per_s", "per_writer_bytes_per_s", "put_rate_per_prefix", "serialize_bytes_per_s"
)


def default_mtbf_s(ranks: int) -> float:
    """Mean time between job interruptions for ``ranks`` GPUs, scaled from Llama 3 405B's observed rate."""
    return LLAMA3_GPU_SECONDS_PER_FAILURE / max(ranks, 1)


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = sqrt(2 δ M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006, eq. 37): τ = sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + ⅑·(δ/2M)] − δ for δ < 2M, else M."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


@dataclass(kw_only=True, slots=True)
class StorageModel:
    """The store as the planner sees it: caps and limits, from a probe profile or from flags."""

    write_bytes_per_s: float
    """Aggregate write bandwidth the whole job can get (all writers together)."""

    per_writer_bytes_per_s: float = math.inf
    """Cap of one writer (one rank's writer process); ``inf`` when unknown."""

    read_bytes_per_s: float | None = None
    """Aggregate read bandwidth (restore estimate), when known."""

    metadata_ops_per_s: float | None = None
    """Metadata operations per second on a POSIX store, when known."""

    kind: Literal["posix", "object"] = "posix"
    """POSIX (metadata-op limit) or object store (request-rate limit per prefix)."""

    put_rate_per_prefix: float = S3_PUT_RATE_PER_PREFIX
    """PUT-class requests per second one prefix sustains (object stores)."""

    prefixes: int = 1
    """Prefixes the writes spread over (ckptio's hash prefix per rank spreads them)."""

    serialize_bytes_per_s: float = math.inf
    """Rate at which one writer turns staged tensors into checksummed file bytes on its host (the stage before
    the store); ``inf`` leaves it out of the model."""

    def __post_init__(self) -> None:
        for name in _POSITIVE_RATES:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("read_bytes_per_s", "metadata_ops_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.kind not in ("posix", "object"):
            raise ConfigError(f"storage kind must be posix or object, got {self.kind!r}")
        if self.prefixes < 1:
            raise ConfigError(f"prefixes must be >= 1, got {self.prefixes}")

    @property
    def request_rate_limit(self) -> float:
        return self.put_rate_per_prefix * self.prefixes


@dataclass(kw_only=True, slots=True)
class Schedule:
    """When the job saves and what a save costs the training loop."""

    interval_s: float | None = None
    """Compute time between saves; None plans at Daly's optimal interval."""

    step_time_s: float | None = None
    """Seconds per training step (to express intervals in steps)."""

    mtbf_s: float | None = None
    """Mean time between job interruptions; None scales Llama 3's observed rate to the job's ranks."""

    save_cost_s: float | None = None
    """Blocking seconds per checkpoint, measured elsewhere; overrides the D2H estimate."""

    d2h_bytes_per_s: float = DEFAULT_D2H_BYTES_PER_S
    """Device-to-host copy bandwidth per rank (the blocking part of an async save)."""

    mode: Literal["async", "sync"] = "async"
    """``async``: save blocks for the copy, the flush overlaps training; ``sync``: training waits."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "step_time_s", "mtbf_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.save_cost_s is not None and self.save_cost_s < 0:
            raise ConfigError(f"save cost must be >= 0, got {self.save_cost_s}")
        if not self.d2h_bytes_per_s > 0:
            raise ConfigError(f"d2h bandwidth must be > 0, got {self.d2h_bytes_per_s}")
        if self.mode not in ("async", "sync"):
            raise ConfigError(f"mode must be async or sync, got {self.mode!r}")


@dataclass(kw_only=True, slots=True)
class BurstBudget:
    """The planner's answer for one job on one store (``ckptio plan --json`` prints exactly these keys)."""

    params: float
    """Model parameters."""
    ranks: int
    """Ranks in the job."""
    writers: int
    """Ranks that write model or optimizer bytes."""
    checkpoint_bytes: float
    """Bytes of one checkpoint, all ranks together."""
    bytes_per_rank_max: float
    """Bytes the largest rank writes (it gates blocking and flush)."""
    objects_per_checkpoint: int
    """Files or objects one checkpoint creates."""
    requests_per_checkpoint: int
    """PUT-class requests one checkpoint costs on an object store (multipart parts included)."""
    mode: str
    """async or sync."""
    blocking_s: float
    """Time an async save blocks the training loop (device-to-host copy of the largest rank)."""
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
    """Seconds to read one checkpoint back, per level, every rank reading at once (``durable``: None when the read
    bandwidth is unknown). Levels other than ``durable`` join as they are planned."""
    modes: dict[str, dict[str, Any]]
    """Per save mode (:data:`ckptio.plan.costs.background.MODES`): ``blocking_s``, ``background_cpu_s``, ``stolen_s``,
    ``flush_s``, ``step_inflation`` (None for a synchronous save) and ``lost_per_save_s``."""
    verdict: str
    """``ok``, ``warn`` (works, with a cost worth fixing) or ``fail`` (the store cannot take the burst)."""
    reasons: list[str] = field(default_factory=list)
    """Each finding behind the verdict, with what to change."""
    reason_codes: list[str] = field(default_factory=list)
    """A stable name per reason: flush-behind, flush-tight, stall, put-rate, interval."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def flush_times(shape: CheckpointShape, storage: StorageModel) -> tuple[float, float, float]:
    """Seconds to flush one checkpoint from bandwidth, from metadata ops and from the request rate.

    The bandwidth figure includes the writers' serialization, which runs before their bytes reach the store.
    """
    data_s = fair_share_flush_s(
        [(c.count, c.bytes) for c in shape.classes], storage.write_bytes_per_s, storage.per_writer_bytes_per_s
    ) + serialize_s(shape, storage)
    metadata_s = requests_s = 0.0
    if storage.kind == "posix" and storage.metadata_ops_per_s:
        metadata_s = shape.objects * METADATA_OPS_PER_OBJECT / storage.metadata_ops_per_s
    if storage.kind == "object":
        requests_s = shape.requests / storage.request_rate_limit
    return data_s, metadata_s, requests_s


def serialize_s(shape: CheckpointShape, storage: StorageModel) -> float:
    """Time the largest rank's writer spends serializing before its first byte reaches the store."""
    return shape.bytes_per_rank_max / storage.serialize_bytes_per_s


def restore_s(shape: CheckpointShape, storage: StorageModel) -> float | None:
    """Seconds for every rank to read its part back at once: the read burst at the fair share of the aggregate read
    bandwidth, or the metadata operations (one open per object, POSIX), whichever is slower."""
    if not storage.read_bytes_per_s:
        return None
    data_s = fair_share_flush_s([(c.count, c.bytes) for c in shape.classes], storage.read_bytes_per_s, math.inf)
    metadata_s = shape.objects / storage.metadata_ops_per_s if storage.metadata_ops_per_s else 0.0
    return max(data_s, metadata_s)


def plan_burst(
    shape: CheckpointShape,
    storage: StorageModel,
    schedule: Schedule,
    *,
    host: HostModel | None = None,
    costs: WriterCosts | None = None,
) -> BurstBudget:
    """The closed-form budget of ``shape``'s checkpoints on ``storage`` under ``schedule``; ``host`` and ``costs``
    feed the per-mode background cost (defaults: :class:`HostModel`, :class:`WriterCosts` with the store's measured
    serialize rate as ckptio's checksum rate)."""
    blocking = (
        schedule.save_cost_s
        if schedule.save_cost_s is not None
        else shape.bytes_per_rank_max / schedule.d2h_bytes_per_s
    )
    data_s, metadata_s, requests_s = flush_times(shape, storage)
    flush = max(data_s, metadata_s, requests_s)
    sync_stall = blocking + flush
    mtbf = schedule.mtbf_s or default_mtbf_s(shape.ranks)
    # δ for Young/Daly: what one checkpoint costs the loop when the flush keeps up.
    cost = blocking if schedule.mode == "async" else sync_stall
    optimal = daly_interval_s(cost, mtbf) if cost > 0 else mtbf
    interval, steps, source = _interval(schedule, optimal)
    state = _steady_state(interval, blocking, flush, schedule.mode, mtbf)
    at_optimum = _steady_state(optimal, blocking, flush, schedule.mode, mtbf)
    budget = BurstBudget(
        params=shape.params,
        ranks=shape.ranks,
        writers=shape.writers,
        checkpoint_bytes=shape.total_bytes,
        bytes_per_rank_max=shape.bytes_per_rank_max,
        objects_per_checkpoint=shape.objects,
        requests_per_checkpoint=shape.requests,
        mode=schedule.mode,
        blocking_s=blocking,
        sync_stall_s=sync_stall,
        flush_s=flush,
        flush_data_s=data_s,
        flush_metadata_s=metadata_s,
        flush_requests_s=requests_s,
        bottleneck=_bottleneck(shape, storage, data_s, metadata_s, requests_s),
        interval_s=interval,
        interval_steps=steps,
        interval_source=source,
        keeps_up=state.keeps_up,
        stall_s_per_checkpoint=state.stall_s,
        overhead_fraction=state.overhead_fraction,
        checkpoint_cost_s=cost,
        mtbf_s=mtbf,
        young_interval_s=young_interval_s(cost, mtbf),
        optimal_interval_s=optimal,
        expected_lost_work_s=state.lost_s,
        waste_fraction=state.waste_fraction,
        gpu_hours_lost_per_day=state.waste_fraction * shape.ranks * 24.0,
        storage_kind=storage.kind,
        put_requests_per_s=shape.requests / max(data_s, metadata_s, 1e-9),
        put_rate_limit=storage.request_rate_limit,
        restore_s={"durable": restore_s(shape, storage)},
        modes=_modes(shape, storage, (data_s, max(metadata_s, requests_s), blocking, interval), host, costs),
        verdict="ok",
    )
    findings = _findings(budget, storage, at_optimum.waste_fraction)
    budget.reason_codes = [code for code, _ in findings]
    budget.reasons = [message for _, message in findings]
    budget.verdict = "fail" if not budget.keeps_up else ("warn" if budget.reasons else "ok")
    return budget


def _modes(shape: CheckpointShape, storage: StorageModel, times: tuple[float, float, float, float],
           host: HostModel | None, costs: WriterCosts | None) -> dict[str, dict[str, Any]]:
    """The background model's per-mode costs; ``times`` = (data, metadata/request, device copy, interval) s."""
    data_s, ops_s, copy_s, interval = times
    if costs is None:
        costs = WriterCosts()
        if math.isfinite(storage.serialize_bytes_per_s):  # the probe's figure: ckptio's framing + crc32c
            costs = replace(costs, checksum_bytes_per_s=storage.serialize_bytes_per_s)
    # The store's own part of the flush: the writers' CPU is the background model's to place.
    store = max(data_s - serialize_s(shape, storage), ops_s)
    modes = predict_modes(bytes_per_rank=shape.bytes_per_rank_max, store_s=store, host=host, costs=costs,
                          interval_s=interval, device_copy_s=copy_s, dtensor_share=shape.dtensor_share,
                          lockstep_ranks=max(1, shape.ranks))
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


def _interval(schedule: Schedule, optimal: float) -> tuple[float, int | None, str]:
    if schedule.interval_s is not None:
        steps = round(schedule.interval_s / schedule.step_time_s) if schedule.step_time_s else None
        return schedule.interval_s, steps, "given"
    if schedule.step_time_s:
        steps = max(1, math.ceil(optimal / schedule.step_time_s))
        return steps * schedule.step_time_s, steps, "daly"
    return optimal, None, "daly"


def _bottleneck(
    shape: CheckpointShape, storage: StorageModel, data_s: float, meta_s: float, req_s: float
) -> str:
    if req_s >= max(data_s, meta_s):
        return "request rate"
    if meta_s >= data_s:
        return "metadata ops"
    if serialize_s(shape, storage) >= data_s / 2:
        return "writer serialization"
    if shape.writers * storage.per_writer_bytes_per_s < storage.write_bytes_per_s:
        return "per-writer bandwidth"
    return "aggregate bandwidth"


def _findings(b: BurstBudget, storage: StorageModel, optimum_waste: float) -> list[tuple[str, str]]:
    """Every problem of the plan as ``(code, message)``, each message saying what to change."""
    out: list[tuple[str, str]] = []
    if not b.keeps_up:
        need = b.checkpoint_bytes / b.interval_s
        out.append((
            "flush-behind",
            f"flush takes {format_duration(b.flush_s)} but saves come every {format_duration(b.interval_s)}: "
            f"the {b.bottleneck} limits it; give the store at least {format_rate(need)} of write bandwidth "
            f"or save at least {format_duration(b.flush_s)} apart",
        ))
    elif b.mode == "async" and b.flush_s > FLUSH_HEADROOM_WARN * b.interval_s:
        out.append((
            "flush-tight",
            f"flush uses {b.flush_s / b.interval_s:.0%} of the interval ({format_duration(b.flush_s)} of "
            f"{format_duration(b.interval_s)}): one slow save and the next one waits; keep it under "
            f"{FLUSH_HEADROOM_WARN:.0%} with a longer interval or more bandwidth",
        ))
    if b.keeps_up and b.overhead_fraction > OVERHEAD_WARN_FRACTION:
        fix = "use async saves (ckptio)" if b.mode == "sync" else "lengthen the interval or speed up the copy"
        out.append((
            "stall",
            f"checkpoints stall training {format_duration(b.stall_s_per_checkpoint)} per save, "
            f"{b.overhead_fraction:.1%} of wall time: {fix}",
        ))
    if storage.kind == "object" and b.put_requests_per_s > b.put_rate_limit:
        out.append((
            "put-rate",
            f"the burst needs {b.put_requests_per_s:,.0f} PUT/s against {b.put_rate_limit:,.0f}/s for "
            f"{storage.prefixes} prefix(es): spread ranks over more prefixes or use larger files and parts",
        ))
    extra_waste = b.waste_fraction - optimum_waste
    if b.interval_source == "given" and extra_waste > INTERVAL_WASTE_WARN:
        side = "longer" if b.interval_s > b.optimal_interval_s else "shorter"
        out.append((
            "interval",
            f"the interval wastes {extra_waste:.1%} more GPU time than Daly's optimum of "
            f"{format_duration(b.optimal_interval_s)} (cost {format_duration(b.checkpoint_cost_s)}, "
            f"MTBF {format_duration(b.mtbf_s)}): save {side} apart",
        ))
    return out
