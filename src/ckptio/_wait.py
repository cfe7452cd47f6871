"""One rule for every wait ckptio makes: its timeout is finite, never negative, and at most :data:`MAX_WAIT_S`.

A lock, ``Event``, ``Condition``, ``Thread.join``, ``select`` or socket timeout longer than
``threading.TIMEOUT_MAX`` (about 292 years on Linux) raises ``OverflowError: timestamp out of range`` instead of
waiting. Such timeouts are not typed in by anyone: they are computed, from a flush pace of a fraction of a byte per
second, from ``every_seconds=1e11`` ("never by time"), or from a ``timeout=`` a caller meant as "forever". Every
wait whose timeout is computed or comes from a caller goes through :func:`bounded`; options that become timeouts
in several places (``commit_timeout_s``, ``close_timeout_s``, ``partner_timeout_s``, ``preempt_grace_s``) are
refused above :data:`MAX_TIMEOUT_S` by the config, which leaves room for the sums and multiples made of them. A
leaf module: every layer may import it.
"""

from __future__ import annotations

import threading

MAX_WAIT_S = float(threading.TIMEOUT_MAX)
"""The longest timeout the platform's waits take."""

MAX_TIMEOUT_S = 1e9
"""The longest timeout option (about 31 years): a few of them added or doubled still stay below
:data:`MAX_WAIT_S`."""


def bounded(seconds: float | None) -> float | None:
    """``seconds`` as a timeout every wait accepts: None (no timeout) stays None, a negative one is 0, and one past
    :data:`MAX_WAIT_S` (an infinity too) is :data:`MAX_WAIT_S`, which waits as long as "forever" does in practice."""
    if seconds is None:
        return None
    return min(max(float(seconds), 0.0), MAX_WAIT_S)
