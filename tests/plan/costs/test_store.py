"""The store's limits as the planner sees them, and the read burst of a restore."""

from __future__ import annotations

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import (
    Schedule,
)
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import uniform_shape

GB = 1e9


@pytest.mark.parametrize(
    "kwargs",
    [
        {"write_bytes_per_s": 0},
        {"write_bytes_per_s": 1, "prefixes": 0},
        {"write_bytes_per_s": 1, "kind": "tape"},
        {"write_bytes_per_s": 1, "metadata_ops_per_s": -1},
    ],
)
def test_bad_storage_models(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        StoreLimits(**kwargs)  # type: ignore[arg-type]


def test_restore_is_the_read_burst_of_every_rank_at_once() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=1.0 * GB)
    fast = StoreLimits(write_bytes_per_s=10 * GB, read_bytes_per_s=4 * GB)
    assert plan_burst(shape, fast, Schedule(interval_s=600)).restore_s == {"durable": pytest.approx(2.0)}
    # Reads bound by metadata: 8 ranks × (1 file + index) + 3 objects, at 1 open/s.
    slow_meta = StoreLimits(write_bytes_per_s=10 * GB, read_bytes_per_s=4 * GB, metadata_ops_per_s=1.0)
    assert plan_burst(shape, slow_meta, Schedule(interval_s=600)).restore_s["durable"] == pytest.approx(19.0)
    unknown = StoreLimits(write_bytes_per_s=10 * GB)
    assert plan_burst(shape, unknown, Schedule(interval_s=600)).restore_s == {"durable": None}
