"""One rule every config dataclass shares: a number option is finite.

NaN compares false with everything, so a range check such as ``lease_s < 0`` lets it through and whatever reads the
option then does something else (``lease_s=nan`` switched the ownership lease off, and two jobs opened one root); an
infinity passes every ``> 0`` check and then never times out, or overflows a sleep or a socket timeout. The check
runs on values, not annotations, so a new float option is covered without a list to keep up to date, and before the
range checks, which cannot see NaN. A leaf module: ``storage`` imports it without importing the rest of ckptio.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import fields
from typing import TYPE_CHECKING

from ckptio.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def reject_non_finite(config: DataclassInstance) -> None:
    """Raise ConfigError naming the first field of ``config`` that holds NaN or an infinity (a float, a numpy
    float or any other real number that is not an integer)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
            raise ConfigError(f"{f.name} must be a finite number, got {value!r}")
