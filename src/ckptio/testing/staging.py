"""Hold a Checkpointer's staging back, to test that a training loop waits for its snapshot before mutating it.

With ``staging="async"`` (the default) ``save()`` returns before its copy runs; a loop (or a framework integration)
that steps its optimizer without a guard then races the copy, and on a tiny model the copy almost always wins, so a
missing guard goes unnoticed. :func:`hold_staging` makes the copy lose every time: the next save's copy starts no
sooner than ``seconds`` from now, so any mutation that does not wait lands in the saved step.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["hold_staging"]


def hold_staging(checkpointer: Any, seconds: float) -> None:
    """Queue a ``seconds`` pause on ``checkpointer``'s staging thread: saves launched after this call are copied
    once it has passed. The pause ends on its own (a missing wait shows as a wrong checkpoint, never a hang)."""
    if not 0 < seconds <= 60:
        raise ValueError(f"seconds must be within (0, 60], got {seconds!r}")
    stager = checkpointer._stager
    if stager.mode != "async":
        raise ValueError("hold_staging needs staging='async' (with 'sync' the copy runs inside save())")
    stager._put(lambda: time.sleep(seconds))
