"""The planner's prediction for the demo job, from two quick measurements taken before any rank starts.

The demo measures this machine's step time (a few steps of one rank's share of the model, in this process)
and its copy bandwidth (the "device-to-host" copy of a CPU job is a memcpy), then asks
:mod:`ckptio.plan.budget` what a synchronous save and an async (ckptio) save should cost on the emulated
store. This module must never start ranks or touch the store: the prediction has to come before the
measurement it is compared with."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from ckptio.demo.model import ModelShape, Trainer
from ckptio.plan.budget import BurstBudget, Schedule, StorageModel, plan_burst
from ckptio.plan.model import CheckpointShape, RankClass

_CALIBRATION_STEPS = 3


@dataclass(kw_only=True, slots=True)
class Prediction:
    """What the planner expects of the demo job."""

    step_time_s: float
    """Measured seconds per training step (one rank's share, in the launcher process)."""

    copy_bytes_per_s: float
    """Measured memcpy bandwidth: the blocking copy of an async save."""

    sync: BurstBudget
    """The plan for ``torch.distributed.checkpoint.save`` (training waits for the flush)."""

    staged: BurstBudget
    """The plan for an async save with one staging slot (ckptio): blocks for the copy only."""


def measure_step_time(shape: ModelShape, world: int, seed: int) -> float:
    """Median time of a few training steps of one rank's share of the model (no collectives)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        share = replace(shape, vocab=shape.vocab // world)
        trainer = Trainer(share, rank=0, world=1, seed=seed)
        trainer.train_step()  # warm-up: first-touch allocation of the Adam moments
        times = []
        for _ in range(_CALIBRATION_STEPS):
            began = time.perf_counter()
            trainer.train_step()
            times.append(time.perf_counter() - began)
    finally:
        torch.set_num_threads(threads)
    return sorted(times)[len(times) // 2]


def checkpoint_shape(shape: ModelShape, world: int) -> CheckpointShape:
    """The demo's checkpoint as the planner sees it: every rank writes an equal share in one file."""
    per_rank = shape.state_bytes() / world
    rank_class = RankClass(count=world, data_bytes=per_rank, extra_bytes=0.0, files=1, objects=2, requests=2)
    return CheckpointShape(params=shape.state_bytes() / 12, ranks=world, classes=(rank_class,))


def predict(
    shape: ModelShape,
    *,
    world: int,
    bytes_per_s: float,
    every: int,
    step_time_s: float,
    copy_bytes_per_s: float,
) -> Prediction:
    """Plan the demo job's saves on a store of ``bytes_per_s``, saving every ``every`` steps."""
    ckpt = checkpoint_shape(shape, world)
    store = StorageModel(write_bytes_per_s=bytes_per_s)

    def plan(mode: str) -> BurstBudget:
        schedule = Schedule(
            interval_s=every * step_time_s,
            step_time_s=step_time_s,
            d2h_bytes_per_s=copy_bytes_per_s,
            mode="sync" if mode == "sync" else "async",
        )
        return plan_burst(ckpt, store, schedule)

    return Prediction(
        step_time_s=step_time_s, copy_bytes_per_s=copy_bytes_per_s, sync=plan("sync"), staged=plan("async")
    )
