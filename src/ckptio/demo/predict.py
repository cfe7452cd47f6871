"""The planner's interval and prediction for the demo job, from the figures :mod:`ckptio.demo.measure` took of this
machine and the calibrate launch's trial saves.

It asks the planner two things: the save interval at which the flush keeps up with headroom (:func:`choose_every`,
:mod:`ckptio.plan.costs.budget`), and what each of the four save modes should cost at the interval used
(:func:`predict`, :func:`ckptio.plan.costs.background.predict_modes` with this host's cores and its measured
per-byte costs). This module must never measure, start ranks or touch the store: the prediction has to come before
the measurement it is compared with."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

from ckptio.demo.measure import MachineFigures
from ckptio.demo.model import ModelShape
from ckptio.errors import ConfigError
from ckptio.plan.costs.background import ModeCost, predict_modes
from ckptio.plan.costs.budget import BurstBudget, plan_burst
from ckptio.plan.costs.calibration import excess_from_trial
from ckptio.plan.costs.inputs import Host, StoreTiming, Workload
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointShape, RankClass
from ckptio.plan.measure.disk import on_local_disk

HEADROOM = 0.5
"""The demo saves so that the planner's flush takes at most this share of the interval: twice the time the
flush needs. The planner's own warning threshold (``flush-tight``) is 0.8; the extra margin covers what it
does not yet model on a small shared machine (the writer's CPU time competing with training)."""
MIN_EVERY = 4
"""Saves at least this many steps apart, so that every interval has clean steps to measure slowdowns by."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Prediction:
    """What the planner expects of the demo job."""

    machine: MachineFigures
    """This machine's figures the prediction rests on (:func:`ckptio.demo.measure.measure_machine`)."""

    sync: BurstBudget
    """The plan for ``torch.distributed.checkpoint.save`` (training waits for the flush)."""

    staged: BurstBudget
    """The plan for an async save with one staging slot (ckptio): blocks for the copy only."""

    modes: dict[str, ModeCost]
    """The background-cost model's cost per save of every save mode (``ckptio.plan.costs.background``): blocking plus
    the training time the writer's CPU takes from the step, with this host's cores and measured per-byte costs."""

    trial_lost_s: float | None = None
    """Measured on the job's ranks: what a trial ckptio save cost the steps (the mean of ranks), or None."""

    direct_io_s_per_gib: float = 0.0
    """From the trial save: what ckptio's ``O_DIRECT`` saves cost the steps per GiB beyond what the model charges
    from their CPU costs (:func:`ckptio.plan.costs.calibration.excess_from_trial`)."""

    bytes_per_rank: float = 0.0
    """The bytes the modes' costs are predicted for: those of the rank that saves the most (ranks in lockstep wait
    for it), as the trial saves staged them; without a trial, an equal share of the state. DCP's planner (ckptio's
    too) writes each replicated tensor from one rank, the least loaded when it comes to it, so the ranks' shares
    differ."""


def checkpoint_shape(checkpoint_bytes: float, world: int) -> CheckpointShape:
    """The demo's checkpoint as the planner sees it: every rank writes an equal share in one file."""
    per_rank = checkpoint_bytes / world
    rank_class = RankClass(count=world, data_bytes=per_rank, extra_bytes=0.0, files=1, objects=2, requests=2)
    return CheckpointShape(params=checkpoint_bytes / 12, ranks=world, classes=(rank_class,))


def plan_demo(
    checkpoint_bytes: float,
    *,
    world: int,
    bytes_per_s: float,
    every: int,
    step_time_s: float,
    copy_bytes_per_s: float,
    mode: Literal["sync", "async"] = "async",
) -> BurstBudget:
    """The planner's budget for saving ``checkpoint_bytes`` over ``world`` ranks every ``every`` steps."""
    schedule = Schedule(
        interval_s=every * step_time_s, step_time_s=step_time_s, d2h_bytes_per_s=copy_bytes_per_s, mode=mode
    )
    return plan_burst(checkpoint_shape(checkpoint_bytes, world), StoreLimits(write_bytes_per_s=bytes_per_s), schedule)


@dataclass(kw_only=True, slots=True, frozen=True)
class IntervalChoice:
    """The save interval the demo runs at, and why."""

    every: int
    """Steps between saves."""

    plan: BurstBudget
    """The planner's async (ckptio) budget at that interval."""

    chosen: bool
    """True: picked by :func:`choose_every`; False: given with ``--every``."""

    @property
    def flush_share(self) -> float:
        """The planner's flush time as a share of the interval."""
        return self.plan.flush_s / self.plan.interval_s

    @property
    def keeps_up(self) -> bool:
        """The planner says the flush keeps up with the demo's headroom."""
        return self.plan.keeps_up and self.flush_share <= HEADROOM

    def reason(self) -> str:
        plan = self.plan
        step = plan.interval_s / self.every
        head = f"a save every {self.every} steps ({plan.interval_s:.1f} s at {step:.2f} s/step)"
        why = (
            f"the planner's flush takes {plan.flush_s:.2f} s, {self.flush_share:.0%} of the interval"
        )
        if self.chosen:
            return f"{head}, chosen by the planner: {why} (keeps up, with {1 / HEADROOM:.0f}x headroom)"
        verdict = "keeps up" if self.keeps_up else "does NOT keep up with headroom"
        return f"{head}, given with --every: {why}: {verdict}"


def _headroom_ok(plan: BurstBudget) -> bool:
    return plan.keeps_up and plan.flush_s <= HEADROOM * plan.interval_s and "flush-tight" not in plan.reason_codes


def choose_every(
    checkpoint_bytes: float,
    *,
    world: int,
    bytes_per_s: float,
    step_time_s: float,
    copy_bytes_per_s: float,
) -> IntervalChoice:
    """The shortest interval (in steps, at least :data:`MIN_EVERY`) at which the planner says ckptio's flush
    keeps up and takes at most :data:`HEADROOM` of the interval."""

    def plan(every: int) -> BurstBudget:
        return plan_demo(
            checkpoint_bytes,
            world=world,
            bytes_per_s=bytes_per_s,
            every=every,
            step_time_s=step_time_s,
            copy_bytes_per_s=copy_bytes_per_s,
        )

    # The flush time does not depend on the interval: one plan gives it, the loop only settles rounding.
    flush_s = plan(MIN_EVERY).flush_s
    every = max(MIN_EVERY, math.ceil(flush_s / (HEADROOM * step_time_s)))
    budget = plan(every)
    while not _headroom_ok(budget):
        every += 1
        budget = plan(every)
    return IntervalChoice(every=every, plan=budget, chosen=True)


def given_every(
    checkpoint_bytes: float, *, every: int, world: int, bytes_per_s: float, step_time_s: float, copy_bytes_per_s: float
) -> IntervalChoice:
    """The planner's view of an interval given with ``--every``."""
    budget = plan_demo(
        checkpoint_bytes,
        world=world,
        bytes_per_s=bytes_per_s,
        every=every,
        step_time_s=step_time_s,
        copy_bytes_per_s=copy_bytes_per_s,
    )
    return IntervalChoice(every=every, plan=budget, chosen=False)


def predict(
    shape: ModelShape,
    *,
    world: int,
    bytes_per_s: float,
    every: int,
    machine: MachineFigures,
    direct_io: bool = True,
    trial_lost_s: float | None = None,
    largest_rank_bytes: float | None = None,
) -> Prediction:
    """Plan the demo job's saves on a store of ``bytes_per_s``, saving every ``every`` steps, on ``machine``. With
    :attr:`MachineFigures.disk` the store is a budget on that disk, so each writer takes the longer of its booking
    and its real write, and a buffered file below the kernel's write-back threshold is serialized before its fsync
    moves a byte; ``direct_io``: ckptio's writer writes around the page cache (the directory store; not the embedded
    S3 server); ``trial_lost_s``: a trial ckptio save's cost, measured on the job's ranks
    (:attr:`Prediction.trial_lost_s`); ``largest_rank_bytes``: the bytes of the rank that saves the most
    (:attr:`Prediction.bytes_per_rank`), from the trial saves; None: an equal share of the state."""
    state_bytes = shape.state_bytes()
    if largest_rank_bytes is not None and not 0 < largest_rank_bytes <= state_bytes:
        raise ConfigError(f"the largest rank's bytes must be within (0, {state_bytes}], got {largest_rank_bytes!r}")
    bytes_per_rank = state_bytes / world if largest_rank_bytes is None else float(largest_rank_bytes)
    booked_s = state_bytes / bytes_per_s
    # The budget on this host's disk: the disk itself may bind.
    store = StoreTiming(store_s=booked_s, direct_io=direct_io) if machine.disk is None \
        else on_local_disk(machine.disk, job_bytes=state_bytes, ranks=world, booked_s=booked_s, direct_io=direct_io)
    workload = Workload(bytes_per_rank=bytes_per_rank, interval_s=every * machine.step_time_s,
                        dtensor_share=min(1.0, shape.sharded_bytes() / world / bytes_per_rank),
                        lockstep_ranks=world, items_per_rank=shape.state_items())

    def model(direct_io_s_per_gib: float) -> dict[str, ModeCost]:
        host = Host(cores_per_rank=max((os.cpu_count() or 1) / world, 0.1), fresh_copy_drag=machine.fresh_copy_drag,
                    direct_io_s_per_gib=direct_io_s_per_gib)
        return predict_modes(workload, store, host=host, costs=machine.costs)

    modes = model(0.0)
    direct_io_s_per_gib = 0.0
    if trial_lost_s is not None and direct_io:
        direct_io_s_per_gib = excess_from_trial(trial_lost_s, modes["ckptio"], bytes_per_rank)
        modes = model(direct_io_s_per_gib)
    sync, staged = (_burst_budget(shape, world=world, bytes_per_s=bytes_per_s, every=every, machine=machine, mode=mode)
                    for mode in ("sync", "async"))
    return Prediction(machine=machine, sync=sync, staged=staged, modes=modes,
                      trial_lost_s=trial_lost_s, direct_io_s_per_gib=direct_io_s_per_gib, bytes_per_rank=bytes_per_rank)


def _burst_budget(shape: ModelShape, *, world: int, bytes_per_s: float, every: int, machine: MachineFigures,
                  mode: Literal["sync", "async"]) -> BurstBudget:
    """The planner's burst budget for the demo job in ``mode``, on ``machine``'s step time and copy bandwidth."""
    return plan_demo(shape.state_bytes(), world=world, bytes_per_s=bytes_per_s, every=every,
                     step_time_s=machine.step_time_s, copy_bytes_per_s=machine.copy_bytes_per_s, mode=mode)
