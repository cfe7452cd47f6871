"""What a save costs the caller's own training step, measured by running it: the drag of a fresh copy of the state
(:func:`measure_fresh_copy_drag`) and the loss of a trial save of the job's own saver (:func:`measure_save_loss`).

Both run the caller's step, in the caller's process, and bracket what they measure with clean steps so that a drift
of the step time cancels. They must never save into a root the job uses: the trial's saver is the caller's, on a
scratch root.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

from ckptio.errors import ConfigError


def _step_seconds(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


def _timed_steps(step: Callable[[], object], count: int) -> list[float]:
    return [_step_seconds(step) for _ in range(count)]


def measure_fresh_copy_drag(step: Callable[[], object], state: Callable[[], Mapping[str, object]], *,
                            steps: int = 4, repeats: int = 2, steady_heap: bool = False) -> float:
    """How much slower the caller's training step runs while a freshly allocated copy of its state is alive:
    mean step time with the copy ÷ without, − 1, floored at 0
    (:attr:`ckptio.plan.costs.inputs.Host.fresh_copy_drag`).

    Runs ``steps`` clean steps, allocates the copy as default ``async_save``'s stager does (new memory for every
    tensor of ``state()``, a DTensor's local shard), runs ``steps`` steps with it alive, frees it, and runs
    ``steps`` clean steps again: the two clean runs bracket the live one, so a drift of the step time over the
    measurement cancels; ``repeats`` times (a CPU step moves on its own by as much as the drag).
    Call it on every rank of a job whose steps wait for each other, at the same point. The copy's own cost (the
    blocking part of such a save) is not in the figure. ``steady_heap``: the caller's process never trims its heap
    (glibc's ``MALLOC_TRIM_THRESHOLD_`` set high, as bench_planner's ranks): the first copy's drag is then set-up,
    paid once, and ``steps`` untimed steps with a first copy alive come before the runs.
    """
    import torch

    def fresh_copy(value: object) -> object:
        if isinstance(value, Mapping):
            return {k: fresh_copy(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [fresh_copy(v) for v in value]
        if isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            return torch.empty_like(local).copy_(local)
        return value

    if steps < 1 or repeats < 1:
        raise ConfigError(f"steps and repeats must be >= 1, got {steps} and {repeats}")
    if steady_heap:
        # The first copy takes the memory the steps were recycling, and they grow their heap; one never trimmed
        # keeps that growth, so the saves after the first meet no drag from it. A trimmed heap grows again at every
        # copy, so this warm-up would hide the drag a trimming process pays at every save (figures:
        # docs/planning-measurements.md).
        with torch.no_grad():
            first = fresh_copy(state())
        _timed_steps(step, steps)
        del first
    clean: list[float] = []
    live: list[float] = []
    for _ in range(repeats):
        clean += _timed_steps(step, steps)
        with torch.no_grad():
            copy = fresh_copy(state())
        live += _timed_steps(step, steps)
        del copy
        clean += _timed_steps(step, steps)
    mean_clean = statistics.fmean(clean)
    return max(0.0, statistics.fmean(live) / mean_clean - 1.0) if mean_clean > 0 else 0.0


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank of the default ``torch.distributed`` process group (an all-reduce): how
    ranks that wait for each other agree to keep stepping while any of them still measures (the ``any_writing``
    of :func:`measure_save_loss`)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def measure_save_loss(step: Callable[[], object], save: Callable[[int], Callable[[], bool]], *, steps: int = 12,
                      repeats: int = 8, any_writing: Callable[[bool], bool] | None = None,
                      every: int | None = None) -> float:
    """Training seconds one save of the job's own saver costs its steps, on the job's own ranks and store: the
    time the call that starts it holds the loop, plus Σ (step begun while it is in flight − the round's mean
    clean step), the mean of ``repeats`` saves. The planner takes from it what its model cannot derive from
    per-byte CPU costs (:func:`ckptio.plan.costs.calibration.excess_from_trial`).

    ``save(index)`` starts save ``index`` (1, 2, …: fresh step numbers on a scratch root) and returns a poll that
    says whether it is done (durable); ``step`` is one training step, with whatever the saver asks of it before
    the optimizer mutates the state. Each save runs between runs of ``steps`` clean steps that bracket it (each
    run closes one round and opens the next), so that a drift of the step time over the measurement cancels. A
    save's cost outlives its durability by a few steps: short brackets count that tail as clean and read less than
    the saves cost a job, hence at least 12 steps. ``every``, the job's interval in steps: each round then takes
    that many steps (its clean run after the save has ``every`` − the steps in flight, never fewer than ``steps``),
    as the job's own rounds do, so that the tail weighs as much in the trial's clean mean as in the job's; with
    shorter rounds it weighs more, and the trial reads less than the job loses (figures:
    docs/planning-measurements.md). Warm the saver up first (its first save boots its writer and allocates its
    staging memory): the figure is a steady save's.

    A job whose ranks wait for each other calls it on every rank at the same point with ``any_writing``
    (:func:`any_rank`): given whether this rank's save is still in flight it says whether any rank's is, so that
    every rank runs as many steps and none waits forever for a peer that stopped stepping; it also lines the
    ranks up before each save. A save that raises (a full disk) is raised again once every round has run, so that
    a rank whose save failed keeps stepping in lockstep with its peers instead of leaving them in a collective.
    """
    if steps < 1 or repeats < 1 or (every is not None and every < 1):
        raise ConfigError(f"steps, repeats and every must be >= 1, got {steps}, {repeats} and {every}")
    agree = any_writing or (lambda writing: writing)
    lost = 0.0
    failures: list[Exception] = []
    before = _timed_steps(step, steps)
    for index in range(1, repeats + 1):
        agree(False)  # the ranks start their saves together
        done, blocking = _start_save(save, index, failures)
        live = []
        while agree(not done()):
            live.append(_step_seconds(step))
        # Every rank stepped as many live steps (they agreed at each), so every rank runs as many clean ones.
        after = _timed_steps(step, max(steps, (every or 0) - len(live)))
        clean = statistics.fmean(before + after)
        before = after
        lost += blocking + sum(live) - clean * len(live)
    if failures:
        raise failures[0]
    return lost / repeats


def _start_save(save: Callable[[int], Callable[[], bool]], index: int,
                failures: list[Exception]) -> tuple[Callable[[], bool], float]:
    """Start save ``index``: its poll and the seconds the call held the loop. A save that raises is kept in
    ``failures`` (raised after the last round) and is done at once, so that this rank's peers in lockstep take as
    many steps as it does."""
    began = time.perf_counter()
    try:
        done = save(index)
    except Exception as exc:
        failures.append(exc)
        done = _nothing_in_flight
    return done, time.perf_counter() - began


def _nothing_in_flight() -> bool:
    return True
