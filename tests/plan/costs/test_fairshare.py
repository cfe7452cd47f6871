"""Max-min fair sharing of one store among classes of flows, and the flush time it gives."""

from __future__ import annotations

import math

import pytest

from ckptio.plan.costs.fairshare import fair_share_flush_s, max_min_rates


def test_max_min_rates_give_leftovers_to_uncapped_flows() -> None:
    assert max_min_rates(10.0, [(2, 1.0), (3, math.inf)]) == pytest.approx([1.0, 8.0 / 3.0])
    assert max_min_rates(math.inf, [(4, 2.0)]) == [2.0]
    assert max_min_rates(6.0, [(3, 5.0)]) == pytest.approx([2.0])


def test_fair_share_flush_phases() -> None:
    # Two writers of 10 and 30 bytes on a 2 B/s store: together at 1 B/s each for 10 s, then 2 B/s for 10 s.
    assert fair_share_flush_s([(1, 10.0), (1, 30.0)], 2.0, math.inf) == pytest.approx(20.0)
    # A 1.5 B/s per-writer cap keeps the big one from using the whole store once alone.
    assert fair_share_flush_s([(1, 10.0), (1, 30.0)], 2.0, 1.5) == pytest.approx(10.0 + 20.0 / 1.5)
