"""Max-min fair sharing of one store's bandwidth among classes of identical flows.

Owns the one rule the planner and the simulator both use for "N writers on a shared store": every active flow
gets an equal share, no flow gets more than its own cap, and what a capped flow leaves is shared by the others
(water-filling). Flows come in classes (``count`` identical flows with one cap) so 16,384 ranks cost as much
as the handful of distinct rank sizes. This module must never model time: callers advance their own clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def max_min_rates(capacity: float, flows: Sequence[tuple[int, float]]) -> list[float]:
    """Rate of one flow in each class, for classes given as ``(count, cap)``; ``cap`` may be ``inf``.

    The total never exceeds ``capacity`` and no flow exceeds its cap; infinite capacity gives each its cap.
    """
    rates = [0.0] * len(flows)
    remaining = capacity
    active = sum(count for count, _ in flows)
    for index in sorted(range(len(flows)), key=lambda i: flows[i][1]):
        count, cap = flows[index]
        if count <= 0:
            continue
        fair = remaining / active if active else 0.0
        rate = min(cap, fair)
        rates[index] = rate
        if not math.isinf(rate):
            remaining = max(remaining - rate * count, 0.0)
        active -= count
    return rates


def fair_share_flush_s(sizes: Sequence[tuple[float, float]], capacity: float, per_flow_cap: float) -> float:
    """Time until the last of several concurrent writes finishes, each class given as ``(count, bytes)`` (a count
    may be fractional: a class that stands for ranks in proportion).

    All writes start together and share ``capacity`` fairly, each capped at ``per_flow_cap``; the smallest
    finish first and hand their share to the rest. The fluid model in closed form: one phase per size.
    """
    if math.isinf(capacity) and math.isinf(per_flow_cap):
        raise ValueError("a flush needs a finite capacity or a finite per-flow cap")
    pending = sorted((size, count) for count, size in sizes if count > 0 and size > 0)
    active = sum(count for _, count in pending)
    elapsed, done = 0.0, 0.0
    for size, count in pending:
        rate = min(per_flow_cap, capacity / active)
        elapsed += (size - done) / rate
        done = size
        active -= count
    return elapsed
