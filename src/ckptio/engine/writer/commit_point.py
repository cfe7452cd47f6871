"""Rank 0's commit point of one step on one level: under the step's lock, ``.metadata`` and the manifest, or —
for a step saved again — the crash-atomic supersede of ``format.supersede``.

* A step not committed yet: ``.metadata``, then the manifest, create-only (the commit).
* A step committed by a save this one may replace (``CommitRequest.may_replace``): the pending record of the old
  and new manifests, the new ``.metadata``, the new manifest by compare-and-swap on the old one's etag, then the
  pending record goes. At every instant the step has a manifest that a reader resolves to the old save or the new
  one; should the new commit fail before its manifest is in place, the old ``.metadata`` is put back.
* A step another save committed: ``CommitError``, nothing touched.

The commit lock (``commit.lock``, create-only) keeps a second committer of the same step (two jobs racing on one
root with ownership off) from overwriting the winner's ``.metadata``; a lock older than ``commit_timeout_s`` is a
crashed committer's. So is, at once, a lock taken under another claim of the root than this job's: this job owns
the root now (its lease is checked before it breaks the lock), so that committer's job is gone (killed and
restarted: the restarted job saves the same step again and must not wait for a dead job's lock). The ownership
lease is checked right before the manifest is written.

``CKPTIO_TEST_PAUSE=<level>:<point>:<dir>`` (tests only: tests/engine/test_supersede_crash.py) makes a writer stop
at a named point of a supersede (``begun``, ``recorded``, ``metadata``, ``manifest``, ``done``), announce it with a
file ``<dir>/<point>`` and wait there to be killed, so that a test can kill -9 at each point in turn.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ckptio.errors import AlreadyExistsError, CommitError, StorageError
from ckptio.format import Manifest, step_dir, write_manifest
from ckptio.format.commit import replace_manifest
from ckptio.format.keys import COMMIT_LOCK, METADATA, supersede_key
from ckptio.format.rollback import Superseded, abandon_supersede, supersedable
from ckptio.format.supersede import PendingSupersede, write_pending
from ckptio.storage.base import Storage, join_key


@dataclass(frozen=True, slots=True)
class CommitPoint:
    """One level's records and how its commits are checked."""

    level: str
    records: Storage
    timeout_s: float
    """A commit lock older than this is a crashed committer's."""
    verify: bool
    """``commit="lease"``: read each manifest back after writing it."""
    check_lease: Callable[[], None]
    """Raises unless this job still owns the root (right before a manifest is written)."""
    claim: str = ""
    """This job's claim of the root (``OwnerRecord.claim``; empty with ownership off), written into its locks."""

    def write(self, manifest: Manifest, raw_metadata: bytes, *,
              may_replace: Callable[[Manifest | None], bool]) -> Superseded | None:
        """Commit ``manifest`` (whose ``.metadata`` is ``raw_metadata``); returns the save it superseded."""
        step = manifest.step
        lock = self._lock(step, manifest.save_id)
        try:
            old = supersedable(self.records, step, save_id=manifest.save_id, may_replace=may_replace)
            if old is None:
                self.records.put(join_key(step_dir(step), METADATA), raw_metadata)
                self.check_lease()
                write_manifest(self.records, manifest, verify=self.verify)
            else:
                self._supersede(manifest, raw_metadata, old)
        finally:
            with contextlib.suppress(StorageError):
                self.records.delete(lock)
        return old

    def _supersede(self, manifest: Manifest, raw_metadata: bytes, old: Superseded) -> None:
        step = manifest.step
        _pause(self.level, "begun")
        write_pending(self.records, step, PendingSupersede(
            old=old.raw_manifest if old.manifest is not None else None, new=manifest.to_json()))
        _pause(self.level, "recorded")
        try:
            self.records.put(join_key(step_dir(step), METADATA), raw_metadata)
            _pause(self.level, "metadata")
            self.check_lease()
            replace_manifest(self.records, manifest, etag=old.etag, verify=self.verify)
        except BaseException:
            abandon_supersede(self.records, step, old)
            raise
        _pause(self.level, "manifest")
        self.records.delete(supersede_key(step))
        _pause(self.level, "done")

    def _lock(self, step: int, save_id: int) -> str:
        key = join_key(step_dir(step), COMMIT_LOCK)
        body = json.dumps({"save_id": save_id, "time": time.time(), "claim": self.claim}).encode()
        for _ in range(2):
            try:
                self.records.put(key, body, mode="create")
                return key
            except AlreadyExistsError:
                try:
                    held = json.loads(self.records.get(key))
                except (StorageError, ValueError):
                    held = {}
                if held.get("save_id") == save_id and held.get("claim", "") == self.claim:
                    return key
                if self._live_lock(held):
                    raise CommitError("another save is committing this step", root=self.records.url,
                                      step=step) from None
                self.records.delete(key)  # stale: its committer died
        raise CommitError("cannot take the step's commit lock", root=self.records.url, step=step)

    def _live_lock(self, held: dict[str, object]) -> bool:
        """Whether another committer may still hold the lock ``held``: it is young, and taken under this job's claim
        (or with ownership off, where there are no claims to tell jobs apart)."""
        other_claim = held.get("claim", "")
        if self.claim and other_claim != self.claim:
            self.check_lease()  # this job owns the root: the lock's job does not, whatever its age
            return False
        taken = held.get("time", 0)
        return time.time() - (float(taken) if isinstance(taken, (int, float)) else 0.0) < self.timeout_s


def _pause(level: str, point: str) -> None:
    wanted = os.environ.get("CKPTIO_TEST_PAUSE")
    if not wanted:
        return
    want_level, want_point, directory = wanted.split(":", 2)
    if (want_level, want_point) != (level, point):
        return
    with open(os.path.join(directory, point), "w"):
        pass
    while True:  # until the test's kill -9
        time.sleep(1)
