"""What ``save`` checks about a step on the training thread, before the ranks agree on it.

* A step is an int >= 0 (numpy and torch integer scalars are converted; a bool, float, None or str is not):
  anything else is a :class:`~ckptio.errors.ConfigError` and never reaches the writer.
* A step saved again supersedes the earlier save (``format.rollback``). A save of a step that is still pending
  waits for it first (up to ``close_timeout_s``), so the two complete in order and each handle tells the truth.
* A save at or below the highest step this Checkpointer saved or restored could be deleted by rank 0's cleanup
  while other ranks write it: rank 0 first reserves the step with its writer, which answers once no cleanup can
  touch it.

Runs no collective and decides nothing on its own: its errors go through the agreement like a bad state's.
"""

from __future__ import annotations

import operator
from typing import Any

from ckptio.engine.trainer.save_tracker import SaveTracker
from ckptio.engine.trainer.writer_proxy import WriterProxy
from ckptio.errors import CkptError, CommitError, ConfigError


def checked_step(step: Any) -> int:
    """``step`` as an int >= 0, else ConfigError."""
    value: int | None
    try:
        value = None if isinstance(step, bool) else operator.index(step)
    except TypeError:
        value = None
    if value is None or value < 0:
        raise ConfigError(f"step must be an int >= 0, got {step!r} ({type(step).__name__})")
    return int(value)


class StepRules:
    """The per-Checkpointer state behind the rules above: the highest step saved or restored."""

    def __init__(self, tracker: SaveTracker, writer: WriterProxy, *, rank: int, root: str, pending_wait_s: float,
                 ack_wait_s: float) -> None:
        self.tracker, self.writer, self.rank, self.root = tracker, writer, rank, root
        self.pending_wait_s, self.ack_wait_s = pending_wait_s, ack_wait_s
        self.high_water: int | None = None

    def seen(self, step: int) -> None:
        """``step`` was saved or restored."""
        self.high_water = step if self.high_water is None else max(self.high_water, step)

    def before_agreement(self, step: int) -> tuple[CkptError | None, bool]:
        """Wait for a pending save of ``step``; reserve it when needed. Returns (error, reserved)."""
        prior = self.tracker.pending_for_step(step)
        if prior is not None and not prior.wait_done(self.pending_wait_s):
            return CommitError(f"an earlier save of this step is still pending after {self.pending_wait_s} s",
                               root=self.root, step=step, rank=self.rank), False
        if self.rank != 0 or self.high_water is None or step > self.high_water:
            return None, False
        self.writer.ensure_started()
        self.writer.reserve(step)
        if not self.tracker.wait_reserved(step, self.ack_wait_s):
            return CommitError("the writer did not acknowledge the save", root=self.root, step=step,
                               rank=self.rank), True
        return None, True

    def after_agreement(self, step: int, reserved: bool) -> None:
        if reserved:
            self.writer.release(step)
