"""When saves happen: Young's and Daly's intervals, the default MTBF, and what a schedule accepts."""

from __future__ import annotations

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.costs.intervals import (
    LLAMA3_GPU_SECONDS_PER_FAILURE,
    Schedule,
    daly_interval_s,
    default_mtbf_s,
    young_interval_s,
)


def test_daly_reproduces_his_own_example() -> None:
    # Daly (2006): M = 24 h, δ = 5 min → τ = 116.7 min.
    assert daly_interval_s(300, 86400) / 60 == pytest.approx(116.7, abs=0.05)


def test_young() -> None:
    assert young_interval_s(300, 86400) == pytest.approx(7200.0)
    assert daly_interval_s(300, 86400) < young_interval_s(300, 86400)


def test_daly_falls_back_to_mtbf_for_huge_costs() -> None:
    assert daly_interval_s(500, 200) == 200


def test_default_mtbf_scales_llama3_to_the_job() -> None:
    # 16,384 GPUs saw one interruption every ~3.1 h.
    assert default_mtbf_s(16384) / 3600 == pytest.approx(3.09, abs=0.01)
    assert default_mtbf_s(8) == pytest.approx(LLAMA3_GPU_SECONDS_PER_FAILURE / 8)


@pytest.mark.parametrize(
    "kwargs", [{"interval_s": 0}, {"mode": "maybe"}, {"d2h_bytes_per_s": 0}, {"save_cost_s": -1}]
)
def test_bad_schedules(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Schedule(**kwargs)  # type: ignore[arg-type]
