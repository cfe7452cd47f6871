"""Replacing committed steps: a step saved again (supersede) and the steps of an abandoned trajectory (rollback).

The rules (documented in the README's "When things fail"):

* **A step saved again by the same run supersedes the committed one** (and so does a save above a restored step,
  see rollback). The later save's commit replaces the step's ``.metadata`` and manifest without a moment in which
  the step is not committed: ``format.supersede`` states the order and how a reader (and the next committer, with
  :func:`finish_supersede`) resolves a supersede a crash interrupted. Only then are the old save's data files
  deleted. Should the new commit fail, the old ``.metadata`` is put back (best effort; until then readers resolve
  the pair through the pending record). A manifest of any other save (a second job racing on the root, an earlier
  run's step saved again without a restore) is never touched: that commit fails with ``CommitError``.
* **Rollback.** After ``restore(step=N)``, the first commit above ``N`` retires every committed step above ``N``
  that this run did not save, *before* its own manifest is written: a crash in between leaves ``N`` the newest
  step, never the abandoned trajectory. ``latest`` is then pointed back at the newest committed step.

Deletes only keys a step owns: its directory's keys ckptio writes (``keys.is_own_key``), or the data key the
storage computes for a plain data file name of that step (never a key read from a manifest). Runs on rank 0's
committer; no processes, no collectives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ckptio.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    CommitError,
    CorruptCheckpointError,
    NotFoundError,
    StorageError,
)
from ckptio.format.commit import committed_steps, read_manifest
from ckptio.format.keys import LATEST, METADATA, durable_data_key, manifest_key, step_dir, supersede_key
from ckptio.format.records import Manifest
from ckptio.format.retention import delete_step, has_fresh_marker
from ckptio.format.supersede import pending_supersede, resolve
from ckptio.storage.base import IfMatch, Storage, join_key


@dataclass(frozen=True, slots=True)
class Superseded:
    """The committed save a new commit of its step replaces: to delete after the commit, or to put back."""

    manifest: Manifest | None
    """None: the old manifest was unreadable (nothing of it is kept or put back)."""
    raw_manifest: bytes
    raw_metadata: bytes | None
    etag: str
    """The old manifest's etag: the new one replaces it only while it is still there."""


def _is_plain_data_name(name: str) -> bool:
    return name.endswith(".distcp") and "/" not in name and "\\" not in name and not name.startswith(".")


def delete_data_files(storage: Storage, step: int, names: Collection[str]) -> None:
    """Delete the data files ``names`` of ``step`` (plain names only), wherever the storage puts them."""
    for name in names:
        if not _is_plain_data_name(name):
            continue
        plain = join_key(step_dir(step), name)
        storage.delete(plain)
        hashed = durable_data_key(storage, step, name)
        if hashed != plain:
            storage.delete(hashed)


def supersedable(storage: Storage, step: int, *, save_id: int,
                 may_replace: Callable[[Manifest | None], bool]) -> Superseded | None:
    """What a commit of save ``save_id`` at ``step`` replaces: None when the step is not committed, or committed by
    this very save (a retried commit). CommitError when ``may_replace`` (given None for an unreadable manifest)
    refuses it: never touch a step another save committed."""
    key = manifest_key(step)
    try:
        etag = storage.head(key).etag
        raw = storage.get(key)
    except NotFoundError:
        return None
    try:
        manifest: Manifest | None = Manifest.from_json(raw, key=key)
    except CorruptCheckpointError:
        manifest = None
    if manifest is not None and manifest.save_id == save_id:
        return None
    if not may_replace(manifest):
        raise CommitError("step is already committed by another save", root=storage.url, step=step)
    try:
        metadata: bytes | None = storage.get(join_key(step_dir(step), METADATA))
    except StorageError:
        metadata = None
    return Superseded(manifest=manifest, raw_manifest=raw, raw_metadata=metadata, etag=etag)


def abandon_supersede(storage: Storage, step: int, old: Superseded) -> None:
    """Best effort: the new commit failed before its manifest was in place; the old save stays the step's."""
    with contextlib.suppress(StorageError):
        if old.raw_metadata is not None:
            storage.put(join_key(step_dir(step), METADATA), old.raw_metadata)
        storage.delete(supersede_key(step))


def finish_supersede(storage: Storage, step: int) -> bool:
    """Complete a supersede of ``step`` that a crash interrupted: the manifest that pairs with ``.metadata`` goes in
    place, the pending record goes, and so do the data files only the other manifest listed. True when there was
    one to finish."""
    pending = pending_supersede(storage, step)
    if pending is None:
        return False
    key = manifest_key(step)
    try:
        etag = storage.head(key).etag
        current = storage.get(key)
    except NotFoundError:
        storage.delete(supersede_key(step))
        return True
    chosen = resolve(storage, step, current, pending)
    if chosen != current:
        storage.put(key, chosen, mode=IfMatch(etag))
    storage.delete(supersede_key(step))
    kept = _files(chosen)
    for other in {current, pending.new, pending.old} - {chosen, None}:
        delete_data_files(storage, step, [name for name in _files(other) if name not in kept])
    return True


def _files(raw: bytes | None) -> set[str]:
    try:
        return set(Manifest.from_json(raw).files) if raw is not None else set()
    except CorruptCheckpointError:
        return set()


def drop_superseded(storage: Storage, step: int, old: Superseded, new: Manifest) -> None:
    """After the new commit: delete the old save's data files that the new manifest does not list."""
    if old.manifest is not None:
        delete_data_files(storage, step, [name for name in old.manifest.files if name not in new.files])


def retire_abandoned(storage: Storage, *, above: int, keep: int, own_save_ids: Collection[int],
                     live: Collection[int], markers_kept_s: float = 0.0) -> list[int]:
    """Retire committed steps above ``above`` (but ``keep``) whose manifest is not one of ``own_save_ids``.

    A step that a save of this writer is writing (``live``), or that a newer attempt left a failure or drop marker
    in less than ``markers_kept_s`` ago (other ranks may still have to read it: ``retention.has_fresh_marker``), is
    only uncommitted and its old data files deleted; any other retired step is deleted whole. Returns the steps
    retired.
    """
    retired = []
    for step in committed_steps(storage):
        if step <= above or step == keep:
            continue
        try:
            manifest: Manifest | None = read_manifest(storage, step)
        except (CheckpointNotFoundError, CorruptCheckpointError):
            manifest = None  # unreadable above the restored step: not this run's, and restore() must skip it
        if manifest is not None and manifest.save_id in own_save_ids:
            continue
        if step in live or has_fresh_marker(storage, step, markers_kept_s):
            storage.delete(manifest_key(step))
            if manifest is not None:
                delete_data_files(storage, step, list(manifest.files))
        else:
            delete_step(storage, step)
        retired.append(step)
    return retired


def point_latest_at_newest(storage: Storage) -> None:
    """``latest`` only moves forward on a commit; after a rollback it is set back to the newest committed step."""
    steps = committed_steps(storage)
    if not steps:
        storage.delete(LATEST)
        return
    with contextlib.suppress(AlreadyExistsError):
        storage.put(LATEST, str(steps[-1]).encode())
