"""The store as the planner sees it, and how long one checkpoint's burst takes to reach it.

Owns :class:`StoreLimits` (caps and limits, from a probe profile or from flags) and the bottleneck model of a flush:
bytes move at the max-min fair share of the aggregate bandwidth, each writer capped at its own
(:func:`~ckptio.plan.costs.fairshare.fair_share_flush_s`); objects cost metadata operations (POSIX) or PUT-class
requests (object stores, per-prefix limit); the slowest of the three sets the flush time. It must never decide
whether that is good enough (the budget does) nor touch a real store (the probe does). How long the checkpoint
takes to come back is :mod:`ckptio.plan.costs.readback`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ckptio.errors import ConfigError
from ckptio.plan.costs.fairshare import fair_share_flush_s
from ckptio.plan.job.checkpoint import CheckpointShape

S3_PUT_RATE_PER_PREFIX = 3500.0
"""PUT/COPY/POST/DELETE requests per second per partitioned prefix (AWS S3 documentation)."""
METADATA_OPS_PER_OBJECT = 2
"""A POSIX object costs a create (temp file) and a rename/link (atomic publish)."""
_POSITIVE_RATES = (
    "write_bytes_per_s", "per_writer_bytes_per_s", "put_rate_per_prefix", "serialize_bytes_per_s"
)


@dataclass(kw_only=True, slots=True)
class StoreLimits:
    """The store as the planner sees it: caps and limits, from a probe profile or from flags."""

    write_bytes_per_s: float
    """Aggregate write bandwidth the whole job can get (all writers together)."""

    per_writer_bytes_per_s: float = math.inf
    """Cap of one writer (one rank's writer process); ``inf`` when unknown."""

    read_bytes_per_s: float | None = None
    """Aggregate read bandwidth (the restore's model), when known."""

    metadata_ops_per_s: float | None = None
    """Metadata operations per second on a POSIX store, when known."""

    metadata_rates: dict[str, float] = field(default_factory=dict)
    """Operations per second of each metadata kind the probe measured (its profile's ``metadata``), which the
    commit's metadata model (:mod:`~ckptio.plan.costs.commit_metadata`) prefers to the single rate."""

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
        for kind, rate in self.metadata_rates.items():
            if not rate > 0:
                raise ConfigError(f"metadata rate of {kind} must be > 0, got {rate}")
        if self.kind not in ("posix", "object"):
            raise ConfigError(f"storage kind must be posix or object, got {self.kind!r}")
        if self.prefixes < 1:
            raise ConfigError(f"prefixes must be >= 1, got {self.prefixes}")

    @property
    def request_rate_limit(self) -> float:
        return self.put_rate_per_prefix * self.prefixes


@dataclass(kw_only=True, slots=True, frozen=True)
class FlushTimes:
    """Seconds one checkpoint's flush takes by each limit alone; the slowest sets the flush."""

    data_s: float
    """From bandwidth, the writers' serialization included (it runs before their bytes reach the store)."""
    metadata_s: float
    """From metadata operations (POSIX; 0 when their rate is unknown)."""
    requests_s: float
    """From the request-rate limit (object stores; 0 on POSIX)."""

    @property
    def total_s(self) -> float:
        return max(self.data_s, self.metadata_s, self.requests_s)


def flush_times(shape: CheckpointShape, storage: StoreLimits) -> FlushTimes:
    """Seconds to flush one checkpoint of ``shape`` to ``storage``, every rank writing at once, by each limit."""
    data_s = fair_share_flush_s(
        [(c.count, c.bytes) for c in shape.classes], storage.write_bytes_per_s, storage.per_writer_bytes_per_s
    ) + serialize_s(shape, storage)
    metadata_s = requests_s = 0.0
    if storage.kind == "posix" and storage.metadata_ops_per_s:
        metadata_s = shape.objects * METADATA_OPS_PER_OBJECT / storage.metadata_ops_per_s
    if storage.kind == "object":
        requests_s = shape.requests / storage.request_rate_limit
    return FlushTimes(data_s=data_s, metadata_s=metadata_s, requests_s=requests_s)


def checkpoint_traffic_cap(shape: CheckpointShape, storage: StoreLimits) -> float:
    """Aggregate bytes a second the checkpoint's traffic can reach under the request rate (object stores) or the
    metadata rate (POSIX, when known): its bytes per operation × operations a second; ``inf`` when neither binds."""
    if storage.kind == "object":
        ops, limit = shape.requests, storage.request_rate_limit
    elif storage.metadata_ops_per_s:
        ops, limit = shape.objects * METADATA_OPS_PER_OBJECT, storage.metadata_ops_per_s
    else:
        return math.inf
    return shape.total_bytes * limit / ops


def serialize_s(shape: CheckpointShape, storage: StoreLimits) -> float:
    """Time the largest rank's writer spends serializing before its first byte reaches the store."""
    return shape.bytes_per_rank_max / storage.serialize_bytes_per_s


def bottleneck(shape: CheckpointShape, storage: StoreLimits, flush: FlushTimes) -> str:
    """What sets the flush time, in words."""
    if flush.requests_s >= max(flush.data_s, flush.metadata_s):
        return "request rate"
    if flush.metadata_s >= flush.data_s:
        return "metadata ops"
    if serialize_s(shape, storage) >= flush.data_s / 2:
        return "writer serialization"
    if shape.writers * storage.per_writer_bytes_per_s < storage.write_bytes_per_s:
        return "per-writer bandwidth"
    return "aggregate bandwidth"
