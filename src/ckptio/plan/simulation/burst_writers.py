"""The writers of the burst simulator: each rank class's stages, their queues, and what a save holds while in them.

Owns the writer side of the model in :mod:`ckptio.plan.simulation.burst`: a save passes through serialize (when
the store model gives a rate), local write (tiered) and upload, one save per stage at a time; it holds a staging
slot until it is durable (``async``) or on the local tier (``tiered``), and a local copy until drained. Must never
decide how fast the store moves bytes (the simulator shares the store) nor when training requests a save.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from ckptio.errors import ConfigError
from ckptio.obs.events import Phase
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointShape
from ckptio.plan.simulation.burst_types import SimulationConfig

__all__ = ["LOCAL_WRITE", "SERIALIZE", "UPLOAD", "BurstWriters", "ClassWriter", "StageJob"]

SERIALIZE, LOCAL_WRITE, UPLOAD = Phase.SERIALIZE, Phase.LOCAL_WRITE, Phase.UPLOAD


@dataclass(slots=True)
class StageJob:
    """One save of one rank class in one writer stage."""

    ckpt: int
    """Index of the save."""
    remaining: float
    """Bytes each rank of the class has left to move through the stage."""
    started: float | None = None
    """When the stage took the save; None while it waits behind the save ahead."""


@dataclass(slots=True)
class ClassWriter:
    """The writer of one rank class: its ranks write alike, so they move as one fluid."""

    index: int
    count: int
    bytes: float
    queues: list[deque[StageJob]]
    """One FIFO per writer stage, in pipeline order; the last is the upload to the store."""
    slots_used: int = 0
    local_held: int = 0

    def pending(self) -> int:
        return sum(len(q) for q in self.queues)


class BurstWriters:
    """Every rank class's writer, and the rules for the staging slots and local-tier copies a save holds."""

    def __init__(self, shape: CheckpointShape, storage: StoreLimits, config: SimulationConfig) -> None:
        self.config = config
        self.storage = storage
        self.stages = _stages(storage, config)
        self.classes = [
            ClassWriter(i, c.count, c.bytes, [deque() for _ in self.stages]) for i, c in enumerate(shape.classes)
        ]
        self.local_slots = _local_capacity(shape, config)

    def busy(self) -> bool:
        return any(c.pending() for c in self.classes)

    def deepest_queue(self) -> int:
        """Saves queued or in flight on the busiest class's writer."""
        return max(c.pending() for c in self.classes)

    def uploading(self) -> list[ClassWriter]:
        return [c for c in self.classes if c.queues[-1]]

    def slot_free(self) -> bool:
        """A new save can be staged: sync saves hold no slot; otherwise every class needs one."""
        return self.config.mode == "sync" or all(c.slots_used < self.config.max_pending for c in self.classes)

    def stage_rate(self, stage: int, c: ClassWriter, upload_rates: list[float]) -> float:
        """Bytes/s one rank of ``c`` moves through ``stage`` now."""
        name = self.stages[stage]
        if name == UPLOAD:
            return upload_rates[c.index]
        if name == SERIALIZE:
            return self.storage.serialize_bytes_per_s
        assert self.config.local_bytes_per_s is not None
        return self.config.local_bytes_per_s / self.config.ranks_per_node

    def running(self) -> Iterator[tuple[int, ClassWriter, StageJob]]:
        """``(stage, class, job)`` of each stage's head job that has started."""
        for c in self.classes:
            for stage, queue in enumerate(c.queues):
                if queue and queue[0].started is not None:
                    yield stage, c, queue[0]

    def start_jobs(self, now: float) -> None:
        """Start each stage's waiting head job, unless the local tier is full."""
        for c in self.classes:
            for stage, queue in enumerate(c.queues):
                if not queue or queue[0].started is not None:
                    continue
                if self.stages[stage] == LOCAL_WRITE:
                    if c.local_held >= self.local_slots:
                        continue  # the local tier is full until a drain finishes
                    c.local_held += 1
                queue[0].started = now

    def enqueue(self, ckpt: int) -> int:
        """Hand a staged save to every class's first stage; the most staging slots a class now holds."""
        for c in self.classes:
            c.queues[0].append(StageJob(ckpt, c.bytes))
            c.slots_used += self.config.mode != "sync"
        return max(c.slots_used for c in self.classes)

    def hand_on(self, stage: int, c: ClassWriter) -> bool:
        """Move ``c``'s finished head job of ``stage`` to the next stage, releasing what it no longer holds.

        True when the save is durable for ``c`` (it left the last stage).
        """
        job = c.queues[stage].popleft()
        if self.stages[stage] == LOCAL_WRITE:
            c.slots_used -= 1  # the staging slot is free once the local tier holds the bytes
        if stage + 1 < len(self.stages):
            c.queues[stage + 1].append(StageJob(job.ckpt, c.bytes))
            return False
        if self.config.mode == "async":
            c.slots_used -= 1
        elif self.config.mode == "tiered":
            c.local_held -= 1
        return True


def _stages(storage: StoreLimits, config: SimulationConfig) -> list[str]:
    """The writer's stages for one save: serialize (when modelled), local write (tiered), upload."""
    stages = [SERIALIZE] if math.isfinite(storage.serialize_bytes_per_s) else []
    return [*stages, LOCAL_WRITE, UPLOAD] if config.mode == "tiered" else [*stages, UPLOAD]


def _local_capacity(shape: CheckpointShape, config: SimulationConfig) -> int:
    """Saves the local tier holds per node; a tier that cannot hold one is a configuration error."""
    if config.mode != "tiered":
        return 0
    assert config.local_capacity_bytes is not None
    per_node = shape.bytes_per_rank_max * config.ranks_per_node
    slots = int(config.local_capacity_bytes // per_node)
    if slots < 1:
        raise ConfigError(
            f"the local tier ({config.local_capacity_bytes / 2**30:.1f} GiB per node) cannot hold "
            f"one checkpoint of {config.ranks_per_node} ranks ({per_node / 2**30:.1f} GiB)"
        )
    return slots
