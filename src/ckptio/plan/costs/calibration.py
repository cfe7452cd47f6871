"""Where the background-cost model (:mod:`ckptio.plan.costs.background`) meets measurements: the term a trial save of
a mode's own writer adds to the model, and how far a prediction landed from what a run measured (the bar every
prediction is held to: within 20 % or 3 points of the time between saves).

It only computes: the trials run in :func:`ckptio.plan.measure.training.measure_save_loss`, the runs in the demo and
the benches.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ckptio.errors import ConfigError
from ckptio.plan.costs.background import ModeCost
from ckptio.plan.costs.inputs import GIB


def excess_from_trial(trial_lost_s: float, modelled: ModeCost, bytes_per_rank: float) -> float:
    """:attr:`~ckptio.plan.costs.inputs.Host.direct_io_s_per_gib` (or
    :attr:`~ckptio.plan.costs.inputs.Host.buffered_io_s_per_gib`) from a trial save: ``trial_lost_s``, what a save
    of ckptio's own writer (DCP-best's) cost the job's steps (:func:`ckptio.plan.measure.training.measure_save_loss`,
    the mean over ranks), less what the model charges that save without the term (``modelled``:
    :func:`~ckptio.plan.costs.background.predict_modes`' ``ckptio`` (``dcp_best``) cost with the term 0; its blocking
    copy (or its wait for a device copy) and its writer's CPU theft, not a wait for the previous save, which a trial
    save never has), per GiB of ``bytes_per_rank``; 0 where the model already charges as much.

    The term is the one part of ckptio's cost the model does not derive from per-byte CPU costs, and the trial runs
    the writer itself: a stand-in that writes the same bytes through the same ``O_DIRECT`` path does not cost what
    the writer's own saves do (it writes back to back; the writer frames, checksums and paces).
    """
    if not (math.isfinite(trial_lost_s) and bytes_per_rank > 0):
        raise ConfigError(f"a trial save needs a finite loss and bytes > 0, got {trial_lost_s!r} and "
                          f"{bytes_per_rank!r}")
    modelled_s = modelled.blocking_s + modelled.staging_wait_s + modelled.stolen_s
    return max(0.0, trial_lost_s - modelled_s) / (bytes_per_rank / GIB)


class PredictionError(NamedTuple):
    """How far a predicted time lost per save is from the measured one."""

    ratio: float
    """Predicted ÷ measured (``inf`` when nothing was measured)."""
    points: float
    """Predicted − measured, in percentage points of the time between saves."""
    within: bool
    """Within the bar: 20 % relative or 3 points (a tiny loss is judged by points, a large one by its ratio)."""


def prediction_error(predicted_s: float, measured_s: float, between_s: float) -> PredictionError:
    """How far ``predicted_s`` lost per save is from ``measured_s``, saves ``between_s`` seconds apart."""
    ratio = predicted_s / measured_s if measured_s > 0 else math.inf
    points = 100.0 * (predicted_s - measured_s) / between_s if between_s > 0 else 0.0
    return PredictionError(ratio=ratio, points=points, within=abs(ratio - 1.0) <= 0.2 or abs(points) <= 3.0)
