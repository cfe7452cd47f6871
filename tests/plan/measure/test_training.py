"""What a save costs the caller's own step: the fresh copy's drag and a trial save's loss, bracketed by clean steps.
Only the bookkeeping and the ranges of the figures are asserted, never a timing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


def test_fresh_copy_drag_brackets_live_steps_with_clean_ones_and_leaves_the_state_alone() -> None:
    """The drag measurement runs clean, live and clean steps around a fresh copy of every tensor (a DTensor's
    local shard) and never writes the state. Its value is a timing: only its range is asserted."""
    import torch

    from ckptio.errors import ConfigError
    from ckptio.plan.measure.training import measure_fresh_copy_drag

    state = {"w": torch.arange(1 << 16, dtype=torch.float32), "nested": {"m": [torch.ones(4)], "step": 3}}
    before = {"w": state["w"].clone(), "m": state["nested"]["m"][0].clone()}
    calls = []

    def step() -> None:
        calls.append(1)
        buffers = [torch.empty(1 << 18).fill_(1.0) for _ in range(4)]  # a CPU step's host buffers
        del buffers

    drag = measure_fresh_copy_drag(step, lambda: state, steps=2, repeats=2)
    assert drag >= 0.0 and len(calls) == 12  # 2 × (2 clean + 2 live + 2 clean)
    calls.clear()
    measure_fresh_copy_drag(step, lambda: state, steps=2, repeats=2, steady_heap=True)
    assert len(calls) == 14  # a never-trimmed heap: 2 untimed steps with a first copy come first
    assert torch.equal(state["w"], before["w"]) and torch.equal(state["nested"]["m"][0], before["m"])
    with pytest.raises(ConfigError):
        measure_fresh_copy_drag(step, lambda: state, steps=0)
    with pytest.raises(ConfigError):
        measure_fresh_copy_drag(step, lambda: state, repeats=0)


def test_save_loss_brackets_each_save_and_steps_while_any_rank_saves() -> None:
    """A trial save's loss: clean steps, the save, steps while it (or a peer's: ``any_writing`` answering yes a
    few more times) is in flight, clean steps shared with the next round; saves numbered from 1. Its value is a
    timing: only that it is finite is asserted."""
    import math

    from ckptio.errors import ConfigError
    from ckptio.plan.measure.training import measure_save_loss

    steps: list[int] = []
    saves: list[int] = []
    peer_saving = [0]

    def step() -> None:
        steps.append(len(saves))
        time.sleep(0.001)

    def save(index: int) -> object:
        saves.append(index)
        polls = [2]  # in flight for two steps

        def done() -> bool:
            polls[0] -= 1
            return polls[0] < 0

        return done

    def any_writing(writing: bool) -> bool:
        peer_saving[0] -= 1
        return writing or peer_saving[0] >= 0

    peer_saving[0] = 1  # the first agreement (the ranks line up) eats one; the peer then saves one step longer
    lost = measure_save_loss(step, save, steps=2, repeats=2, any_writing=any_writing)  # type: ignore[arg-type]
    assert math.isfinite(lost)
    assert saves == [1, 2]
    assert steps.count(0) == 2 and steps.count(1) >= 2 + 2 and steps.count(2) == 2 + 2
    for bad in ({"steps": 0}, {"repeats": 0}):
        with pytest.raises(ConfigError):
            measure_save_loss(step, save, **bad)  # type: ignore[arg-type]


def test_save_loss_at_the_jobs_interval_takes_every_steps_per_round() -> None:
    """Given the job's interval, each round is as long as the job's: the clean run after a save fills the round up
    to ``every`` steps (here 7 − 2 in flight = 5), and never runs fewer than ``steps`` (a flight longer than the
    interval)."""
    from ckptio.errors import ConfigError
    from ckptio.plan.measure.training import measure_save_loss

    def run(every: int, flight: int) -> list[int]:
        steps: list[int] = []
        saves: list[int] = []

        def save(index: int) -> object:
            saves.append(index)
            polls = [flight]
            def done() -> bool:
                polls[0] -= 1
                return polls[0] < 0
            return done

        measure_save_loss(lambda: steps.append(len(saves)), save, steps=3, repeats=2,  # type: ignore[arg-type]
                          every=every)
        return [steps.count(n) for n in range(3)]

    assert run(every=7, flight=2) == [3, 7, 7]
    assert run(every=4, flight=2) == [3, 2 + 3, 2 + 3]
    with pytest.raises(ConfigError):
        measure_save_loss(lambda: None, lambda index: (lambda: True), every=0)  # type: ignore[arg-type]


def test_a_trial_save_that_fails_is_raised_after_every_round_has_stepped() -> None:
    """A save that raises on one rank (a full disk) must not leave its peers in the collective: the rank goes on
    through every round, agreeing at each step as they do, and raises the save's own error at the end."""
    from ckptio.errors import StorageError
    from ckptio.plan.measure.training import measure_save_loss

    saves: list[int] = []
    agreements: list[bool] = []

    def save(index: int) -> object:
        saves.append(index)
        if index == 2:
            raise StorageError("no space left on device")
        return lambda: True

    def any_writing(writing: bool) -> bool:
        agreements.append(writing)
        return writing

    with pytest.raises(StorageError, match="no space"):
        measure_save_loss(lambda: None, save, steps=1, repeats=3, any_writing=any_writing)  # type: ignore[arg-type]
    assert saves == [1, 2, 3]
    assert agreements == [False, False] * 3  # per round: line up, then "nothing in flight"


def test_save_loss_of_a_real_checkpointer_commits_every_trial_save(tmp_path: Path) -> None:
    """Through ckptio's own writer, as the planner's harnesses call it: every trial save is committed by the time
    the measurement returns (it steps until each is durable)."""
    import math

    import torch

    from ckptio import Checkpointer
    from ckptio.plan.measure.training import measure_save_loss

    state = {"w": torch.randn(1 << 18)}
    with Checkpointer(root=str(tmp_path), max_pending=1) as checkpointer:
        checkpointer.save(0, state).wait()

        def save(index: int) -> object:
            return checkpointer.save(index, state).done

        def step() -> None:
            checkpointer.wait_staged()
            state["w"].mul_(1.0)

        lost = measure_save_loss(step, save, steps=1, repeats=3)  # type: ignore[arg-type]
        assert math.isfinite(lost)
        assert checkpointer.latest_step() == 3
