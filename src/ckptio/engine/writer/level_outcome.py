"""How a save attempt ends on one level: the one failure path of the writer, and the messages of the other ends.

A save goes to one or two levels (``durable_level``, ``local_level``); on each it ends exactly once, through this
level's :class:`LevelOutcome`, whichever part of the writer learns the outcome:

* the job pipeline, when the save's shared part fails (before its files are written): every level the save goes
  to fails, each through its own outcome;
* the level itself, when its own part fails (the durable upload or index, the local level's no-room case);
* the level's :class:`~ckptio.engine.writer.step_committer.StepCommitter`, when the commit (rank 0) or the watch
  (other ranks) fails, is dropped, or succeeds.

**A failure** writes this level's marker (``engine.failure_markers``: a failure stops the levels whose part it hit,
so each level marks its own records; a failure learned *from* another rank's marker is not marked again), deletes
this rank's files of the attempt that no other level still reads (the level's ``discard``), ends the step's
liveness for this level, and tells the trainer when this level's outcome is the save's (``Attempt.reports``), else
emits ``level_failed``. A drop and a success end the same way without the marker.

It never decides whether a save failed, only how that is recorded and told.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ckptio.engine.failure_markers import FailureMarkers, level_only
from ckptio.engine.protocol import CommitInfo, JobLevels, Outbox, SaveDone, SaveDropped, SaveFailed, WriterStart
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.errors import CkptError, StorageError
from ckptio.format import Manifest
from ckptio.format.local_level_records import holder_nodes
from ckptio.obs.events import Event


@dataclass(frozen=True, slots=True)
class Attempt:
    """One save attempt of this rank, as each of its levels sees it."""

    step: int
    save_id: int
    n_files: int
    """This rank's data files in the attempt (what a failure deletes)."""
    levels: JobLevels
    """Every level the attempt goes to: a file another of them still reads is never deleted by this one."""

    def reports(self, level: str) -> bool:
        """Is ``level``'s outcome the save's outcome (the durable one when the save goes there, else local)?"""
        return self.levels.reporting == level


def report_failure(out: Outbox, start: WriterStart, step: int, save_id: int, exc: BaseException) -> None:
    """Tell the trainer a save failed, always with a CkptError (it names the root, step and rank)."""
    out.event(Event.SAVE_FAILED, step, error=str(exc), error_type=type(exc).__name__)
    if not isinstance(exc, CkptError):
        wrapped = StorageError(f"{type(exc).__name__}: {exc}", root=start.durable.url, step=step, rank=start.rank)
        wrapped.__cause__ = None
        exc = wrapped
    out.send(SaveFailed(step, save_id, exc))


class LevelOutcome:
    """The end of each attempt on one level: marker, deletion, liveness and the message, in that order."""

    def __init__(self, name: str, start: WriterStart, out: Outbox, live: LiveSteps, *, markers: FailureMarkers,
                 discard: Callable[[Attempt], None]) -> None:
        self.name, self.start, self.out, self.live = name, start, out, live
        self.markers, self.discard = markers, discard

    def failed(self, attempt: Attempt, exc: BaseException, *, who: str | None = None, mark: bool = True) -> None:
        """The attempt cannot commit on this level. ``mark=False``: the failure was read from another rank's
        marker, which every rank already sees. ``who`` names the marker (default: this rank)."""
        if mark:
            self.markers.mark(level_only(self.name), attempt.step, who or f"rank{self.start.rank}", attempt.save_id,
                              exc)
        self._end(attempt)
        if self.name != "durable":
            self.out.event(Event.LEVEL_FAILED, attempt.step, level=self.name, error=str(exc),
                           error_type=type(exc).__name__)
        if attempt.reports(self.name):
            report_failure(self.out, self.start, attempt.step, attempt.save_id, exc)

    def dropped(self, attempt: Attempt, reason: str) -> None:
        """A rank gave the attempt up on purpose: nothing of it commits, and the trainer counts it as skipped."""
        self._end(attempt)
        if attempt.reports(self.name):
            self.out.send(SaveDropped(attempt.step, attempt.save_id, reason))

    def committed(self, attempt: Attempt, manifest: Manifest) -> None:
        """This rank saw the level's manifest of the attempt (the caller ends the step's liveness under its
        cleanup lock, so that no cleanup runs between the two)."""
        if self.name != "durable":
            self.out.event(Event.LEVEL_COMMITTED, attempt.step, level=self.name,
                           durable_too=not attempt.reports(self.name), holders=holder_nodes(manifest))
        if attempt.reports(self.name):
            info = CommitInfo(total_bytes=manifest.total_bytes, files=len(manifest.files))
            self.out.send(SaveDone(attempt.step, attempt.save_id, info))

    def _end(self, attempt: Attempt) -> None:
        self.discard(attempt)
        self.live.remove(attempt.step)
