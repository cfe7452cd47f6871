"""Where a save attempt's failure and drop markers go: one rule, for the trainer and the writer alike.

A rank that knows an attempt cannot commit tells the committer and the other ranks' watchers through the store:
a marker under the step's ``failed/`` in a level's records, which that level's committer and watchers read
(``engine.writer.step_committer``), so every rank ends the save at once instead of at ``commit_timeout_s``.

**The rule: a marker goes to the records of every level the failure stops.**

* A failure before the save's files are written (the staging copy, a refused or undecidable save, a dead writer,
  the first tier) stops the save on every level it goes to: its marker goes to each of those levels' records.
* A failure in one level's own part (the durable upload or index, the local level's copies, a commit) stops
  that level only: its marker goes to that level's records, and the other level goes on.

A drop marker (no rank failed: the attempt was given up on purpose, e.g. no free staging slot) follows the same
rule. Callers say which levels stopped; this module alone turns that into stores.
"""

from __future__ import annotations

from ckptio.engine.protocol import JobLevels
from ckptio.format.commit import write_failure
from ckptio.storage.base import Storage


class FailureMarkers:
    """The records of each level of one job: the durable root's, and the local level's (None: one level)."""

    def __init__(self, durable: Storage, local: Storage | None = None) -> None:
        self.durable, self.local = durable, local

    def stores(self, stopped: JobLevels) -> tuple[Storage, ...]:
        """The records a marker of a failure that stops the levels ``stopped`` goes to."""
        wanted = ((self.durable, stopped.durable), (self.local, stopped.local))
        return tuple(store for store, on in wanted if on and store is not None)

    def mark(self, stopped: JobLevels, step: int, who: str, save_id: int, error: BaseException | str, *,
             dropped: bool = False) -> None:
        """Write the marker of attempt ``save_id`` of ``step`` by ``who`` to every level in ``stopped``. A store
        that refuses it is skipped: the committer's timeout is the fallback."""
        for store in self.stores(stopped):
            write_failure(store, step, who, save_id, error, dropped=dropped)


def level_only(name: str) -> JobLevels:
    """The levels a failure of level ``name``'s own part stops: that level alone."""
    return JobLevels(durable=name == "durable", local=name == "local")
