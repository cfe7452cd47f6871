"""Prometheus metrics of saves, derived from the event stream (``obs.events``): the contract metric names live
here.

``SaveMetrics.observe`` is an ``EventLog`` listener: the engine forwards the writer's events into the
trainer's log, so what the writer measures (flush phases, bytes, commits) reaches the training process's
registry without a second channel. This module owns the metric names, labels and the event → metric mapping;
it must never do I/O on the save path, and never raise from ``observe`` on an event it does not understand
(a metrics bug must not stop a save).

Bytes rule: a byte is counted once per tier, from ``phase`` events only: ``local_write`` counts toward
``tier="local"`` and ``upload`` toward ``tier="durable"`` (the record's own ``tier`` field wins when
present). ``serialize`` and the small metadata phases are not counted: they either write nothing or write
bookkeeping.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server

from ckptio.errors import ConfigError
from ckptio.obs.events import Event, Phase

__all__ = ["BYTES_PHASES", "MetricsExporter", "SaveMetrics", "start_exporter"]

# A phase that moves checkpoint bytes onto a tier, and the tier it counts toward when the record names none.
BYTES_PHASES: dict[str, str] = {Phase.LOCAL_WRITE: "local", Phase.UPLOAD: "durable"}

# Blocking time should be milliseconds (a host copy); the top buckets exist to show when it is not.
_BLOCKING_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Flushes span seconds (local NVMe) to tens of minutes (a slow bucket under a burst).
_FLUSH_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
)


@dataclass(kw_only=True, slots=True)
class _Collectors:
    """The collectors of one registry, created once (prometheus_client refuses a name registered twice)."""

    blocking: Histogram
    """``ckptio_save_blocking_seconds{rank}``: how long ``save()`` held the training loop."""

    flush: Histogram
    """``ckptio_save_flush_seconds{rank}``: save() return → commit seen by this rank."""

    bytes_total: Counter
    """``ckptio_save_bytes_total{rank,tier}``: checkpoint bytes written to each tier."""

    pending: Gauge
    """``ckptio_pending_saves{rank}``: staged snapshots not yet flushed."""

    skipped: Counter
    """``ckptio_saves_skipped_total{rank}``: saves dropped by ``overflow="skip"``."""

    failures: Counter
    """``ckptio_save_failures_total{rank}``: background saves that failed."""

    flush_lag: Gauge
    """``ckptio_flush_lag_seconds{rank}``: commit time − save request time, of the latest commit."""

    last_committed: Gauge
    """``ckptio_last_committed_step{rank}``: newest step this rank saw committed."""

    pace_target: Gauge
    """``ckptio_flush_pace_target_bytes_per_second{rank,tier}``: the rate the latest paced flush aimed at."""

    pace_achieved: Gauge
    """``ckptio_flush_pace_achieved_bytes_per_second{rank,tier}``: the rate it kept (bytes ÷ its duration)."""

    pace_stretch: Histogram
    """``ckptio_flush_pace_stretch_seconds{rank,tier}``: how long the pace held each paced flush back."""


def _create(registry: CollectorRegistry) -> _Collectors:
    kw: dict[str, Any] = {"registry": registry}
    return _Collectors(
        blocking=Histogram(
            "ckptio_save_blocking_seconds",
            "Time save() blocked the training loop (agree + stage).",
            ["rank"],
            buckets=_BLOCKING_BUCKETS,
            **kw,
        ),
        flush=Histogram(
            "ckptio_save_flush_seconds",
            "Time from save() returning to the step being committed.",
            ["rank"],
            buckets=_FLUSH_BUCKETS,
            **kw,
        ),
        bytes_total=Counter(
            "ckptio_save_bytes", "Checkpoint bytes written, per storage tier.", ["rank", "tier"], **kw
        ),
        pending=Gauge("ckptio_pending_saves", "Staged snapshots not yet flushed.", ["rank"], **kw),
        skipped=Counter(
            "ckptio_saves_skipped", "Saves skipped because no staging slot was free.", ["rank"], **kw
        ),
        failures=Counter("ckptio_save_failures", "Background saves that failed.", ["rank"], **kw),
        flush_lag=Gauge(
            "ckptio_flush_lag_seconds", "Commit time minus save request time, latest commit.", ["rank"], **kw
        ),
        last_committed=Gauge("ckptio_last_committed_step", "Newest step seen committed.", ["rank"], **kw),
        pace_target=Gauge("ckptio_flush_pace_target_bytes_per_second", "Rate the latest paced flush aimed at.",
                          ["rank", "tier"], **kw),
        pace_achieved=Gauge("ckptio_flush_pace_achieved_bytes_per_second",
                            "Rate the latest paced flush kept (bytes over its duration).", ["rank", "tier"], **kw),
        pace_stretch=Histogram("ckptio_flush_pace_stretch_seconds", "Time the pace held a paced flush back.",
                               ["rank", "tier"], buckets=_FLUSH_BUCKETS, **kw),
    )


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, _Collectors] = weakref.WeakKeyDictionary()
_BY_REGISTRY_LOCK = threading.Lock()


def _collectors_for(registry: CollectorRegistry) -> _Collectors:
    with _BY_REGISTRY_LOCK:
        found = _BY_REGISTRY.get(registry)
        if found is None:
            found = _BY_REGISTRY[registry] = _create(registry)
        return found


class SaveMetrics:
    """The contract metrics of one rank, updated from events by :meth:`observe`.

    Several instances may share a registry (two ``Checkpointer`` objects in one process): the collectors are
    created once per registry and shared; each instance only writes its ``rank`` label.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, rank: int) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ConfigError(f"rank must be a non-negative int, got {rank!r}")
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise ConfigError(
                f"registry must be a prometheus_client.CollectorRegistry, got {type(registry)!r}"
            )
        self.registry = REGISTRY if registry is None else registry
        self.rank = rank
        self._c = _collectors_for(self.registry)
        self._last_committed = -1
        # Touch the unlabelled-by-tier series so a scrape before the first save shows zeros, not absence.
        label = str(rank)
        for metric in (self._c.blocking, self._c.flush, self._c.pending, self._c.skipped, self._c.failures):
            metric.labels(rank=label)
        for tier in ("local", "durable"):
            self._c.bytes_total.labels(rank=label, tier=tier)

    def observe(self, record: dict[str, Any]) -> None:
        """Update the metrics from one event record (an ``EventLog`` listener). Unknown events are ignored."""
        event = record.get("event")
        handler = _HANDLERS.get(event) if isinstance(event, str) else None
        if handler is None:
            return
        try:
            handler(self, record, str(record.get("rank", self.rank)))
        except (TypeError, ValueError):
            # A malformed field (None where a number was expected) loses one sample, never the save.
            return

    def _on_save_returned(self, record: dict[str, Any], rank: str) -> None:
        self._c.blocking.labels(rank=rank).observe(float(record["blocking_s"]))

    def _on_committed(self, record: dict[str, Any], rank: str) -> None:
        if record.get("flush_s") is not None:
            self._c.flush.labels(rank=rank).observe(float(record["flush_s"]))
        if record.get("lag_s") is not None:
            self._c.flush_lag.labels(rank=rank).set(float(record["lag_s"]))
        step = record.get("step")
        if step is not None and int(step) > self._last_committed:
            self._last_committed = int(step)
            self._c.last_committed.labels(rank=rank).set(self._last_committed)

    def _on_phase(self, record: dict[str, Any], rank: str) -> None:
        default_tier = BYTES_PHASES.get(record.get("phase", ""))
        nbytes = record.get("bytes")
        if default_tier is None or not nbytes:
            return
        tier = record.get("tier") or default_tier
        self._c.bytes_total.labels(rank=rank, tier=str(tier)).inc(float(nbytes))

    def _on_queue(self, record: dict[str, Any], rank: str) -> None:
        self._c.pending.labels(rank=rank).set(float(record["pending"]))

    def _on_skipped(self, record: dict[str, Any], rank: str) -> None:
        self._c.skipped.labels(rank=rank).inc()

    def _on_failed(self, record: dict[str, Any], rank: str) -> None:
        self._c.failures.labels(rank=rank).inc()

    def _on_paced(self, record: dict[str, Any], rank: str) -> None:
        tier = str(record.get("tier") or "durable")
        self._c.pace_target.labels(rank=rank, tier=tier).set(float(record["target_bytes_per_s"]))
        self._c.pace_achieved.labels(rank=rank, tier=tier).set(float(record["achieved_bytes_per_s"]))
        self._c.pace_stretch.labels(rank=rank, tier=tier).observe(float(record["stretched_s"]))


_HANDLERS: dict[str, Callable[[SaveMetrics, dict[str, Any], str], None]] = {
    Event.SAVE_RETURNED: SaveMetrics._on_save_returned,
    Event.COMMITTED: SaveMetrics._on_committed,
    Event.PHASE: SaveMetrics._on_phase,
    Event.QUEUE: SaveMetrics._on_queue,
    Event.SAVE_SKIPPED: SaveMetrics._on_skipped,
    Event.SAVE_FAILED: SaveMetrics._on_failed,
    Event.FLUSH_PACED: SaveMetrics._on_paced,
}


class MetricsExporter:
    """A running ``/metrics`` endpoint; :meth:`close` stops it. ``port`` is the bound port (useful with 0)."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host: str = server.server_address[0]
        self.port: int = server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_exporter(
    port: int, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> MetricsExporter:
    """Serve ``registry`` (default: the global one) at ``http://host:port/metrics`` from a daemon thread.

    ``port=0`` binds a free port (read it back from ``.port``). Loopback by default: metrics name hosts and
    steps, so exposing them on every interface is the caller's explicit choice.
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics port must be an int in 0..65535, got {port!r}")
    try:
        server, thread = start_http_server(
            port, addr=host, registry=REGISTRY if registry is None else registry
        )
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    return MetricsExporter(server, thread)


def start_rank_exporter(base_port: int | None, rank: int, *, host: str,
                        registry: CollectorRegistry | None) -> MetricsExporter | None:
    """A rank's exporter, or None when ``base_port`` is None. Each rank's metrics live in its own process: rank r
    serves on ``base_port + r`` (``base_port=0``: any free port)."""
    if base_port is None:
        return None
    return start_exporter(base_port + rank if base_port else 0, host=host, registry=registry)
