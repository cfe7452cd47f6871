"""What the planner needs to know of this machine before the demo's runs, measured in the launcher process before any
rank starts: the writers' per-byte CPU costs, the disk under the directory store, one rank's training step (and its
slowdown while a fresh copy of the state is alive), and the copy bandwidth.

Owns the order of those measurements, which matters on a VM: the per-byte costs come first, because the training
measurement frees fresh copies of the state and the disk probe deletes its files, and pages freed a moment ago make
page-cache writes several times cheaper than the runs' saves meet them (their new files go to pages never touched).
What a save costs the job's own ranks is measured by the ranks (the calibrate launch); this module never starts a
rank, and never predicts (:mod:`ckptio.demo.predict` does).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import torch

from ckptio.demo.model import ModelShape, Trainer, TrainState
from ckptio.plan.costs.inputs import WriterCosts
from ckptio.plan.measure.disk import DiskRates, measure_disk
from ckptio.plan.measure.training import measure_fresh_copy_drag
from ckptio.plan.measure.writer_costs import measure_copy_bandwidth, measure_writer_costs

_CALIBRATION_STEPS = 8
"""Steps timed for the step time (their median), and per run of :func:`measure_fresh_copy_drag`."""
_DRAG_REPEATS = 3
"""Runs of :func:`measure_fresh_copy_drag`'s bracketed steps: its default (2 runs of 3 steps) read the drag too
noisily for default ``async_save``'s prediction, which moves with it (docs/planning-measurements.md); 3 runs of 8
steps cost the demo about ten seconds."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingFigures:
    """What the planner needs to know of the demo's training step, measured on one rank's share of the model."""

    step_time_s: float
    """Median seconds per step (no collectives)."""

    fresh_copy_drag: float
    """:attr:`ckptio.plan.costs.inputs.Host.fresh_copy_drag`: the step's slowdown while a freshly allocated copy of
    the state is alive (default ``async_save``'s staging)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class MachineFigures:
    """This machine as the demo's planner sees it (:func:`measure_machine`)."""

    step_time_s: float
    """Seconds per training step (one rank's share, in the launcher process)."""

    copy_bytes_per_s: float
    """Memcpy bandwidth: the blocking copy of a CPU job's async save."""

    fresh_copy_drag: float
    """The step's slowdown while a fresh copy of the state is alive (:class:`TrainingFigures`)."""

    costs: WriterCosts
    """This host's per-byte CPU costs of a save's work
    (:func:`ckptio.plan.measure.writer_costs.measure_writer_costs`)."""

    disk: DiskRates | None = None
    """The disk beneath the directory store (:func:`ckptio.plan.measure.disk.measure_disk`); None for a store whose
    bytes go through a socket (the embedded S3 server)."""


def measure_training(shape: ModelShape, world: int, seed: int) -> TrainingFigures:
    """Time a few training steps of one rank's share of the model (no collectives), then the same steps with a
    fresh copy of its state alive."""
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
        drag = measure_fresh_copy_drag(trainer.train_step, TrainState(trainer, None).state_dict,
                                       steps=_CALIBRATION_STEPS, repeats=_DRAG_REPEATS)
    finally:
        torch.set_num_threads(threads)
    return TrainingFigures(step_time_s=statistics.median(times), fresh_copy_drag=drag)


def measure_machine(shape: ModelShape, *, world: int, seed: int, store_dir: str, disk: bool) -> MachineFigures:
    """Every figure of :class:`MachineFigures`, in the order the module docstring gives; ``store_dir`` holds the
    probes' files (removed), ``disk``: measure the disk under it (a directory store)."""
    costs = measure_writer_costs(directory=store_dir)
    rates = measure_disk(store_dir) if disk else None
    training = measure_training(shape, world, seed)
    return MachineFigures(step_time_s=training.step_time_s, copy_bytes_per_s=measure_copy_bandwidth(),
                          fresh_copy_drag=training.fresh_copy_drag, costs=costs, disk=rates)
