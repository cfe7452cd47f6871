"""The burst simulator: a fluid model of a job's saves, its writers, their queues and one shared store.

Owns what the closed-form budget hides: saves that queue behind a slow flush one at a time, skipped saves,
flushes slowed by the data loader's reads (and training slowed by the flush taking the loader's share), the
local tier filling up, request-rate caps. It must never create a Python object per byte, request or rank:
ranks that write alike are one class (:class:`~ckptio.plan.job.checkpoint.RankClass`) and move as one fluid, so
16,384 ranks cost what a handful of classes cost.

The model (documented assumptions, each a choice that can be argued with):

* Training alternates compute (``interval_s`` of compute time) and a save request; saves and skips are
  agreed by every rank, so all classes see the same requests. While training computes, its data loaders
  read ``loader_read_bytes_per_s`` from the same store; when they get less, compute slows in proportion.
  While training is stopped (copying, waiting for a slot, a synchronous save), the loaders are idle.
* The store's aggregate bandwidth is shared max-min fairly among every active flow — one per rank writing a
  checkpoint (capped at the per-writer bandwidth) and one loader per rank (capped at its demand). PUT-rate
  and metadata limits cap the checkpoint traffic as a whole (bytes per operation × operations per second).
* Each rank's writer takes its saves one after another through its stages: serialize (host CPU, when the
  store model gives a rate), local write (tiered), upload (the shared store); a stage holds one save at a
  time. ``async``: a staging slot is held from the copy until the rank's flush is durable. ``tiered``: the
  slot is held until the rank's local write is done; the local copy is held until drained to the store; a
  full local tier holds the slot too. ``sync``: training waits for the copy and the whole flush.
* A paced job (``SimulationConfig.pace``, ``Checkpointer(flush_pace=)``) holds each writer's upload to its paced
  rate (:meth:`~ckptio.plan.costs.pace.FlushPace.rank_rate`) until the next save is requested, which sends the
  flush in progress to full speed, as the engine's writer does; the peak the store sees falls to the paced demand
  of :mod:`ckptio.plan.costs.pace`.
* A checkpoint commits when the last class's flush of it is durable (manifest and index writes are small and
  ignored).
* Stages of successive saves may overlap (save k+1 serializes or lands on the local tier while save k
  uploads), as the design intends; today's writer takes one save at a time through all its stages, which
  differs only with ``max_pending`` > 1 or a local tier.
"""

from __future__ import annotations

import math

import numpy as np

from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.fairshare import max_min_rates
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.store import StoreLimits, checkpoint_traffic_cap
from ckptio.plan.job.checkpoint import CheckpointShape
from ckptio.plan.simulation.burst_types import CheckpointRecord, SimulationConfig, SimulationResult
from ckptio.plan.simulation.burst_writers import UPLOAD, BurstWriters, ClassWriter

__all__ = ["CheckpointRecord", "SimulationConfig", "SimulationResult", "simulate"]

_EPS_S = 1e-9
_MAX_EVENTS = 5_000_000


def simulate(
    shape: CheckpointShape, storage: StoreLimits, schedule: Schedule, config: SimulationConfig
) -> SimulationResult:
    """Run ``config.checkpoints`` saves of ``shape`` on ``storage`` under ``schedule``."""
    budget = plan_burst(shape, storage, schedule)  # the same blocking, interval and caps the planner uses
    sim = _Simulator(shape, storage, config, interval_s=budget.interval_s, blocking_s=budget.blocking_s)
    return sim.run(plan_flush_s=budget.flush_s)


class _Simulator:
    """The event loop: advance to the next completion, apply it, repeat.

    Owns training (compute, save requests, copies) and the store's sharing among writers and loaders; the
    writers' stages, slots and local tier are :class:`~ckptio.plan.simulation.burst_writers.BurstWriters`'.
    """

    def __init__(
        self,
        shape: CheckpointShape,
        storage: StoreLimits,
        config: SimulationConfig,
        *,
        interval_s: float,
        blocking_s: float,
    ) -> None:
        self.shape, self.storage, self.config = shape, storage, config
        self.interval_s, self.blocking_s = interval_s, blocking_s
        self.writers = BurstWriters(shape, storage, config)
        self.classes = self.writers.classes
        self.ckpt_cap = checkpoint_traffic_cap(shape, storage)
        self.loader_per_rank = config.loader_read_bytes_per_s / shape.ranks
        self.t = 0.0
        self.phase = "compute"  # compute | waiting | copying | sync
        self.compute_left = interval_s
        self.copy_left = 0.0
        self.records: list[CheckpointRecord] = []
        self.done_classes: dict[int, int] = {}
        self.idle_s = self.slow_s = self.busy_s = self.bytes_written = 0.0
        self.wall_s = 0.0
        self.peak_slots = 0
        self.peak_demand = 0.0
        self.compute_segments: list[tuple[float, float, float]] = []

    # ---- the loop ------------------------------------------------------------------------------------------
    def run(self, *, plan_flush_s: float) -> SimulationResult:
        for _ in range(_MAX_EVENTS):
            if self._finished():
                return self._result(plan_flush_s)
            self.writers.start_jobs(self.t)
            upload_rates, loader_total = self._rates()
            compute_rate = self._compute_rate(loader_total)
            dt = self._horizon(upload_rates, compute_rate)
            self._advance(dt, upload_rates, compute_rate)
            self._complete_jobs()
            self._advance_training()
        raise RuntimeError("simulation did not finish; this is a bug in the simulator")

    def _finished(self) -> bool:
        requested = len(self.records)
        idle_training = self.phase == "compute" and math.isinf(self.compute_left)
        drained = not self.writers.busy()
        return requested == self.config.checkpoints and idle_training and drained

    def _rates(self) -> tuple[list[float], float]:
        """Per-rank upload rate of each class (0 when idle) and the loaders' aggregate read rate."""
        active = self.writers.uploading()
        loader_on = self.phase == "compute" and self.loader_per_rank > 0
        flows = [(c.count, self._writer_cap(c)) for c in active]
        if loader_on:
            flows.append((self.shape.ranks, self.loader_per_rank))
        shares = max_min_rates(self.storage.write_bytes_per_s, flows)
        writer_total = sum(c.count * r for c, r in zip(active, shares, strict=False))
        loader_total = shares[-1] * self.shape.ranks if loader_on else 0.0
        if writer_total > self.ckpt_cap:
            scale = self.ckpt_cap / writer_total
            shares = [r * scale for r in shares[: len(active)]] + shares[len(active) :]
            freed = writer_total - self.ckpt_cap
            if loader_on:
                loader_total = min(self.config.loader_read_bytes_per_s, loader_total + freed)
        rates = [0.0] * len(self.classes)
        for c, r in zip(active, shares, strict=False):
            rates[c.index] = r
        return rates, loader_total

    def _writer_cap(self, c: ClassWriter) -> float:
        """One rank's upload cap: the store's per-writer cap, held to its paced rate while its flush is the newest
        save's (a later request sends it to full speed, as the engine's ``hurry``)."""
        cap, pace = self.storage.per_writer_bytes_per_s, self.config.pace
        if pace is None or self.config.mode == "sync" or c.queues[-1][0].ckpt < len(self.records) - 1:
            return cap
        return min(cap, pace.rank_rate(c.bytes, self.interval_s))

    def _compute_rate(self, loader_total: float) -> float:
        if self.phase != "compute":
            return 0.0
        if self.config.loader_read_bytes_per_s <= 0:
            return 1.0
        return min(1.0, loader_total / self.config.loader_read_bytes_per_s)

    def _horizon(self, upload_rates: list[float], compute_rate: float) -> float:
        dt = math.inf
        for stage, c, job in self.writers.running():
            rate = self.writers.stage_rate(stage, c, upload_rates)
            if rate > 0:
                dt = min(dt, job.remaining / rate)
        if self.phase == "compute" and compute_rate > 0:
            dt = min(dt, self.compute_left / compute_rate)
        elif self.phase == "copying":
            dt = min(dt, self.copy_left)
        if math.isinf(dt):
            raise RuntimeError(f"simulation stalled in phase {self.phase!r}; this is a bug in the simulator")
        return max(dt, 0.0)

    def _advance(self, dt: float, upload_rates: list[float], compute_rate: float) -> None:
        for stage, c, job in self.writers.running():
            moved = min(job.remaining, self.writers.stage_rate(stage, c, upload_rates) * dt)
            job.remaining -= moved
            if self.writers.stages[stage] == UPLOAD:
                self.bytes_written += moved * c.count
        if dt > 0:
            demand = sum(upload_rates[c.index] * c.count for c in self.classes)
            self.peak_demand = max(self.peak_demand, demand)
        if any(c.queues[-1] for c in self.classes):
            self.busy_s += dt if self._counting() else 0.0
        if self.phase == "compute":
            if not math.isinf(self.compute_left):
                self.compute_left = max(self.compute_left - compute_rate * dt, 0.0)
            if self._counting():
                self.slow_s += (1.0 - compute_rate) * dt
            self._record_compute(dt, compute_rate)
        elif self._counting():
            self.idle_s += dt
        if self.phase == "copying":
            self.copy_left = max(self.copy_left - dt, 0.0)
        self.t += dt

    def _record_compute(self, dt: float, rate: float) -> None:
        if dt <= 0:
            return
        segments = self.compute_segments
        if segments and segments[-1][2] == rate and abs(segments[-1][1] - self.t) <= _EPS_S:
            segments[-1] = (segments[-1][0], self.t + dt, rate)
        else:
            segments.append((self.t, self.t + dt, rate))

    def _counting(self) -> bool:
        """Idle and busy time count until the last request returns; the drain after it does not."""
        return len(self.records) < self.config.checkpoints or self.phase != "compute"

    # ---- completions ---------------------------------------------------------------------------------------
    def _complete_jobs(self) -> None:
        """Move each finished head job to its next stage; repeat while zero-byte jobs pass through."""
        moved = True
        while moved:
            self.writers.start_jobs(self.t)
            moved = False
            for stage, c, job in list(self.writers.running()):
                if job.remaining > _EPS_S * max(c.bytes, 1.0):
                    continue
                name = self.writers.stages[stage]
                self.records[job.ckpt].phases.append((c.index, name, job.started or self.t, self.t))
                if self.writers.hand_on(stage, c):
                    self._class_done(job.ckpt)
                moved = True

    def _class_done(self, ckpt: int) -> None:
        self.done_classes[ckpt] = self.done_classes.get(ckpt, 0) + 1
        if self.done_classes[ckpt] == len(self.classes):
            record = self.records[ckpt]
            record.committed_s = self.t
            record.lag_s = self.t - record.requested_s
            if record.returned_s is not None:
                record.flush_s = self.t - record.returned_s

    # ---- training ------------------------------------------------------------------------------------------
    def _advance_training(self) -> None:
        more = len(self.records) < self.config.checkpoints
        if self.phase == "compute" and self.compute_left <= _EPS_S and more:
            self._request_save()
        if self.phase == "waiting" and self.writers.slot_free():
            self._start_copy()
        if self.phase == "copying" and self.copy_left <= _EPS_S:
            self._copy_done()
        if self.phase == "sync" and self.records[-1].committed_s is not None:
            self._resume()

    def _request_save(self) -> None:
        record = CheckpointRecord(index=len(self.records), requested_s=self.t,
                                  queue_depth=self.writers.deepest_queue())
        self.records.append(record)
        if self.writers.slot_free():
            self._start_copy()
        elif self.config.overflow == "skip":
            record.skipped = True
            self._resume()
        else:
            self.phase = "waiting"

    def _start_copy(self) -> None:
        self.phase, self.copy_left = "copying", self.blocking_s

    def _copy_done(self) -> None:
        record = self.records[-1]
        record.returned_s = self.t
        self.peak_slots = max(self.peak_slots, self.writers.enqueue(record.index))
        if self.config.mode == "sync":
            self.phase = "sync"
            self._complete_jobs()  # a class with nothing to write is done at once
            if record.committed_s is not None:
                self._resume()
        else:
            self._resume()

    def _resume(self) -> None:
        record = self.records[-1]
        record.stall_s = 0.0 if record.skipped else self.t - record.requested_s
        last = len(self.records) == self.config.checkpoints
        if last:
            self.wall_s = self.t
        self.phase, self.compute_left = "compute", (math.inf if last else self.interval_s)

    # ---- the answer ----------------------------------------------------------------------------------------
    def _result(self, plan_flush_s: float) -> SimulationResult:
        flushes = [r.flush_s for r in self.records if r.flush_s is not None]
        lags = [(r.index, r.lag_s) for r in self.records if r.lag_s is not None]
        wall = self.wall_s or self.t
        idle_fraction = min((self.idle_s + self.slow_s) / wall, 1.0) if wall > 0 else 0.0
        compute_s = wall - self.idle_s
        skipped = sum(r.skipped for r in self.records)
        depth = max(r.queue_depth for r in self.records)
        return SimulationResult(
            mode=self.config.mode,
            ranks=self.shape.ranks,
            rank_classes=len(self.classes),
            checkpoints=len(self.records),
            skipped=skipped,
            interval_s=self.interval_s,
            blocking_s=self.blocking_s,
            flush_s=float(np.median(flushes)) if flushes else math.inf,
            flush_s_max=max(flushes) if flushes else math.inf,
            stall_s_per_checkpoint=sum(r.stall_s for r in self.records) / len(self.records),
            lag_growth_s_per_checkpoint=_slope(lags),
            queue_depth_max=depth,
            keeps_up=self.config.mode == "sync" or (skipped == 0 and depth == 0),
            gpu_idle_fraction=idle_fraction,
            gpu_idle_hours_per_day=idle_fraction * self.shape.ranks * 24.0,
            loader_slowdown_fraction=self.slow_s / compute_s if compute_s > 0 else 0.0,
            storage_utilization=self.bytes_written / (self.storage.write_bytes_per_s * max(self.t, _EPS_S)),
            store_busy_fraction=min(self.busy_s / wall, 1.0) if wall > 0 else 0.0,
            host_staging_bytes_per_rank=self.peak_slots * self.shape.bytes_per_rank_max,
            wall_s=wall,
            plan_flush_s=plan_flush_s,
            peak_store_demand_bytes_per_s=self.peak_demand,
            records=self.records,
            compute_segments=self.compute_segments,
        )


def _slope(points: list[tuple[int, float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = zip(*points, strict=True)
    return float(np.polyfit(np.array(xs, dtype=float), np.array(ys, dtype=float), 1)[0])
