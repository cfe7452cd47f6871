"""The demo's prediction is for the rank that saves the most: ranks in lockstep wait for it, and DCP's planner (which
ckptio and the DCP modes share) writes each replicated tensor from one rank, so the ranks' shares differ."""

from __future__ import annotations

import pytest

from ckptio.demo.measure import MachineFigures
from ckptio.demo.model import ModelShape
from ckptio.demo.predict import Prediction, predict
from ckptio.errors import ConfigError
from ckptio.plan.costs.inputs import WriterCosts

SHAPE = ModelShape()
WORLD = 2


def _predict(largest_rank_bytes: float | None = None) -> Prediction:
    # Saves far apart: no flush runs into the next save.
    machine = MachineFigures(step_time_s=0.1, copy_bytes_per_s=10e9, fresh_copy_drag=0.0, costs=WriterCosts())
    return predict(SHAPE, world=WORLD, bytes_per_s=200 * 2**20, every=1000, machine=machine,
                   largest_rank_bytes=largest_rank_bytes)


def test_without_a_trial_every_rank_saves_an_equal_share() -> None:
    assert _predict().bytes_per_rank == pytest.approx(SHAPE.state_bytes() / WORLD)


def test_the_rank_saving_the_most_costs_the_background_modes_more() -> None:
    equal = _predict()
    largest = 1.06 * SHAPE.state_bytes() / WORLD  # the demo's ranks: 157 and 178 MB of 335
    uneven = _predict(largest)
    assert uneven.bytes_per_rank == largest
    # dcp.save waits for the shared store's booking of the whole checkpoint, however the ranks split it.
    assert uneven.modes["dcp_sync"] == equal.modes["dcp_sync"]
    for mode in ("dcp_async", "dcp_best", "ckptio"):
        assert uneven.modes[mode].lost_per_save_s > equal.modes[mode].lost_per_save_s, mode
        assert uneven.modes[mode].lost_per_save_s < 1.2 * equal.modes[mode].lost_per_save_s, mode


@pytest.mark.parametrize("bad", [0, -1.0, SHAPE.state_bytes() + 1])
def test_a_largest_share_outside_the_state_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError, match="largest rank"):
        _predict(bad)
