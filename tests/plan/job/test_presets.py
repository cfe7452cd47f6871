"""MLPerf Storage's checkpoint workloads as presets: their sizes match the benchmark's reference figures."""

from __future__ import annotations

import pytest

from ckptio.plan.job.checkpoint import shape_checkpoint
from ckptio.plan.job.presets import PRESETS

GIB = 2**30


@pytest.mark.parametrize(
    ("name", "params", "gib", "ranks"),
    [
        ("mlperf-llama3-8b", 8.030e9, 104.7, 8),
        ("mlperf-llama3-70b", 69.88e9, 911.2, 64),
        ("mlperf-llama3-405b", 405.9e9, 5291.7, 512),
        ("mlperf-llama3-1t", 1183e9, 15425, 1024),
    ],
)
def test_mlperf_presets_match_the_reference_within_half_a_percent(
    name: str, params: float, gib: float, ranks: int
) -> None:
    shape = shape_checkpoint(PRESETS[name].spec())
    assert shape.params == pytest.approx(params, rel=0.005)
    assert shape.total_bytes / GIB == pytest.approx(gib, rel=0.005)
    assert shape.ranks == ranks
    assert sum(c.count for c in shape.classes) == ranks


def test_dlio_parameter_formula_for_llama3_8b_exactly() -> None:
    arch = PRESETS["mlperf-llama3-8b"].architecture
    assert arch.params == 8_030_261_248
    assert shape_checkpoint(PRESETS["mlperf-llama3-8b"].spec()).total_bytes == 14 * 8_030_261_248
