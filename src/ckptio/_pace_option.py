"""The ranges of the flush pace options: one rule for the Checkpointer (``flush_pace=``, ``flush_pace_fraction=``)
and for the command line that spells them (``--flush-pace``, ``--flush-pace-fraction`` of ``plan``, ``admit`` and
``simulate``), so a value the planner accepts is one a job can run with, and the reverse.

A rate is bytes per second between :data:`MIN_PACE_BYTES_PER_S` and :data:`MAX_PACE_BYTES_PER_S` (finite: a NaN
or an infinity is refused): below a byte a second a checkpoint would take longer to flush than any job runs, and a
model fed such a rate divides its way to infinities. A fraction lies in [:data:`MIN_PACE_FRACTION`, 1]. Whatever
rate a job ends up with at run time (``"auto"`` with ``every_seconds=1e11`` computes far smaller ones) is still
safe: every wait is bounded (``ckptio._wait``), and the next save or ``close()`` hurries the flush. A leaf module.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal

from ckptio.errors import ConfigError

MIN_PACE_BYTES_PER_S = 1.0
"""The slowest pace: a byte a second."""
MAX_PACE_BYTES_PER_S = 1e15
"""The fastest pace: more than any store or link moves."""
MIN_PACE_FRACTION = 0.01
"""A flush squeezed into less than a hundredth of the interval is no pace: the burst is the store's whole speed."""


def check_flush_pace(value: object, *, what: str = "flush_pace") -> float | Literal["auto"] | None:
    """``value`` as a flush pace (None, ``"auto"``, or bytes per second in range), else ConfigError naming
    ``what``."""
    if value is None:
        return None
    if value == "auto":
        return "auto"
    rate = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not MIN_PACE_BYTES_PER_S <= rate <= MAX_PACE_BYTES_PER_S:
        raise ConfigError(f'{what} must be None, "auto" or bytes per second within [{MIN_PACE_BYTES_PER_S:g}, '
                          f"{MAX_PACE_BYTES_PER_S:g}], got {value!r}")
    return rate


def check_pace_fraction(value: object, *, what: str = "flush_pace_fraction") -> float:
    """``value`` as the share of the interval an ``"auto"`` flush may take, else ConfigError naming ``what``."""
    fraction = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not MIN_PACE_FRACTION <= fraction <= 1:
        raise ConfigError(f"{what} must be within [{MIN_PACE_FRACTION:g}, 1], got {value!r}")
    return fraction
