"""The one owner of a rank's ``local_dir``: its space, and which files leave it when.

**Every deletion in ``local_dir`` goes through :class:`LocalTier`.** The job pipeline asks it before a save (the
byte budget ``local_capacity_bytes``) and after a full disk (ENOSPC), and to delete a failed attempt's files; each
level's committer asks it after a commit; the local level asks it to drop the partner copies its server received for
steps that never committed. One owner, so that no two deleters can disagree on what a restore may still need. (The
partner server's temporary files of a copy still arriving are the receiver's own until they are renamed into
place: ``engine.partner.files``.) One rule serves every caller:

* A step that a save of this writer is writing (live) is never evicted, nor are partner copies of steps above the
  newest commit (a partner's save of them may still be arriving).
* After a commit of step ``S`` on either level, own and partner copies below ``S`` go: the local level keeps only
  its newest step, and a durable commit makes older local copies of single-level saves plain cache.
* To make room for a save of ``S``, an older step goes only once it is *superseded*: committed on the durable level
  (its local files are then a cache) or older than the newest local-level commit. Never the only copy of the
  newest local-level step.
* A failed attempt's own files go, and partner copies of a step that did not commit on the local level go when the
  writer stops.

Deletions are best effort (a failing disk must not fail a committed save); the next commit retries them. This
module never writes a data file, never reads a staging slot, and never deletes anything of the durable root.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable

from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.errors import StorageError, StorageFullError
from ckptio.format import all_step_dirs, committed_steps, manifest_key, step_dir
from ckptio.format.keys import parse_step_dir
from ckptio.format.local_level_records import PARTNERS_DIR, partner_copy_key
from ckptio.format.rollback import delete_data_files
from ckptio.storage.base import Storage, join_key


class LocalTier:
    """A rank's local directory (own step directories and the ``partners/`` area) and its byte budget."""

    def __init__(self, storage: Storage, *, durable: Storage, local_records: Storage | None, live: LiveSteps,
                 budget: int | None, rank: int) -> None:
        self.storage, self.durable, self.local_records = storage, durable, local_records
        self.live, self.budget, self.rank = live, budget, rank

    # ---- what is where ------------------------------------------------------------------------------------------
    def _own_steps(self) -> list[int]:
        return all_step_dirs(self.storage)

    def _partner_steps(self) -> list[int]:
        return sorted(s for s in map(parse_step_dir, self.storage.list_dirs(PARTNERS_DIR)) if s is not None)

    def used_bytes(self) -> int:
        return sum(info.size for info in self.storage.list(""))

    def _superseded(self, step: int) -> bool:
        """Can ``step``'s local copies go without losing a restorable step?"""
        if self.durable.exists(manifest_key(step)):
            return True
        if self.local_records is None:
            return False
        return any(s > step for s in committed_steps(self.local_records))

    def _delete(self, step: int) -> None:
        self.storage.delete_prefix(step_dir(step))

    # ---- the callers ---------------------------------------------------------------------------------------------
    def discard(self, step: int, names: Collection[str]) -> None:
        """Delete this rank's files ``names`` of a failed attempt at ``step`` (never another attempt's)."""
        with contextlib.suppress(StorageError):
            delete_data_files(self.storage, step, names)

    def drop_partner_copies(self, copies: Iterable[tuple[int, str]], *, committed: Collection[int]) -> None:
        """Delete the partner copies ``(step, name)`` received for steps not in ``committed`` (the writer stops:
        a later commit's eviction would only find them once a later step commits)."""
        for step, name in copies:
            if step not in committed:
                with contextlib.suppress(StorageError):
                    self.storage.delete(partner_copy_key(step, name))

    def evict_below(self, step: int, live: frozenset[int]) -> None:
        """After a commit of ``step`` on any level: own and partner copies of older steps go (not live ones)."""
        with contextlib.suppress(StorageError):
            for old in self._own_steps():
                if old < step and old not in live:
                    self._delete(old)
            for old in self._partner_steps():
                if old < step:
                    self.storage.delete_prefix(join_key(PARTNERS_DIR, step_dir(old)))

    def free_for(self, step: int) -> bool:
        """The disk is full (ENOSPC) while saving ``step``: evict older superseded steps. True when any went."""
        evicted = False
        with self.live.cleaning() as live:
            for old in self._own_steps():
                if old < step and old not in live and self._superseded(old):
                    self._delete(old)
                    evicted = True
        return evicted

    def make_room(self, step: int, need: int) -> None:
        """Keep the tier within its budget for a save of ``step`` needing ``need`` bytes: evict older superseded
        steps, else StorageFullError (the save then fails; training goes on)."""
        budget = self.budget
        if budget is None:
            return
        if need > budget:  # hopeless: keep what the tier holds (a restore may still want it)
            raise StorageFullError(f"local tier budget exhausted: this save needs {need:,} bytes of {budget:,}",
                                   root=self.storage.url, step=step, rank=self.rank)
        with self.live.cleaning() as live:
            for old in self._own_steps():
                if self.used_bytes() + need <= budget:
                    return
                if old < step and old not in live and self._superseded(old):
                    self._delete(old)
        used = self.used_bytes()
        if used + need > budget:
            raise StorageFullError(f"local tier budget exhausted: {used + need:,} bytes needed of {budget:,}",
                                   root=self.storage.url, step=step, rank=self.rank)
