"""The demo's per-save figures: stall and lag the slowest rank's, time lost the mean over ranks."""

from __future__ import annotations

import pytest

from ckptio.demo.job import RankResult
from ckptio.demo.steady import per_save
from ckptio.obs.timeline import SaveTrace, StepSample, Timeline


def _rank(rank: int, *, blocking: float, flush_steps: list[float], lag: float) -> tuple[list[StepSample], SaveTrace]:
    """Four clean steps of 1 s, a save at t=4 (returned after ``blocking``), then its flush steps, committed after
    them."""
    steps = [StepSample(rank=rank, step=i, start=float(i), seconds=1.0) for i in range(4)]
    t = 4.0 + blocking
    for i, seconds in enumerate(flush_steps):
        steps.append(StepSample(rank=rank, step=5 + i, start=t, seconds=seconds, kind="flush"))
        t += seconds
    trace = SaveTrace(rank=rank, step=4, requested=4.0, returned=4.0 + blocking, committed=t - 0.01,
                      blocking_s=blocking, lag_s=lag)
    return steps, trace


def _figures(*ranks: tuple[list[StepSample], SaveTrace]) -> tuple[float, float, float | None]:
    timeline = Timeline(steps={r: s for r, (s, _) in enumerate(ranks)},
                        saves={r: [t] for r, (_, t) in enumerate(ranks)}, end={})
    results = [RankResult(mode="ckptio", rank=r) for r in range(len(ranks))]
    (save,) = per_save(timeline, results)
    return save.stall_s, save.lost_s, save.lag_s


def test_time_lost_is_the_mean_over_ranks_and_stall_and_lag_the_slowest_ranks() -> None:
    """Lockstep ranks' sums over a save's few flush steps differ by how far one runs ahead of the other: one rank
    high by what the other is low. The job's loss is their mean; the maximum would take the high side every save."""
    stall, lost, lag = _figures(_rank(0, blocking=0.01, flush_steps=[1.1, 1.0], lag=2.0),
                                _rank(1, blocking=0.03, flush_steps=[1.2, 1.2], lag=2.5))
    assert stall == pytest.approx(0.03) and lag == pytest.approx(2.5)
    assert lost == pytest.approx(((0.01 + 0.1) + (0.03 + 0.4)) / 2)


def test_a_rank_below_its_clean_pace_counts_against_the_other_and_the_stall_is_the_floor() -> None:
    """A rank whose flush steps ran faster than its clean mean (it had been behind) lowers the mean, unfloored;
    the job never loses less than the slowest stall."""
    _, lost, _ = _figures(_rank(0, blocking=0.0, flush_steps=[0.9, 1.0], lag=2.0),
                          _rank(1, blocking=0.0, flush_steps=[1.3, 1.0], lag=2.0))
    assert lost == pytest.approx((-0.1 + 0.3) / 2)
    stall, lost, _ = _figures(_rank(0, blocking=0.05, flush_steps=[0.8, 1.0], lag=2.0),
                              _rank(1, blocking=0.05, flush_steps=[0.9, 1.0], lag=2.0))
    assert lost == pytest.approx(stall) == pytest.approx(0.05)
