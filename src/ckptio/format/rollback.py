"""Replacing committed steps: a step saved again (supersede) and the steps of an abandoned trajectory (rollback).

The rules (documented in the README's "When things fail"):

* **A step saved again by the same run supersedes the committed one** (and so does a save above a restored step,
  see rollback). The later save's commit first *uncommits* the step (deletes its manifest, so a reader never sees
  the old manifest with the new ``.metadata``), then writes ``.metadata`` and the new manifest, and only then
  deletes the old save's data files. Should the new commit fail after the step was uncommitted, the old manifest
  and ``.metadata`` are put back (best effort). A manifest of any other save (a second job racing on the root, an
  earlier run's step saved again without a restore) is never touched: that commit fails with ``CommitError``.
* **Rollback.** After ``restore(step=N)``, the first commit above ``N`` retires every committed step above ``N``
  that this run did not save, *before* its own manifest is written: a crash in between leaves ``N`` the newest
  step, never the abandoned trajectory. ``latest`` is then pointed back at the newest committed step.

Deletes only keys a step owns: its directory, or the data key the storage computes for a plain data file name of
that step (never a key read from a manifest). Runs on rank 0's committer; no processes, no collectives.
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
from ckptio.format.keys import LATEST, METADATA, durable_data_key, manifest_key, step_dir
from ckptio.format.records import Manifest
from ckptio.format.retention import delete_step, has_fresh_marker
from ckptio.storage.base import Storage, join_key


@dataclass(frozen=True, slots=True)
class Superseded:
    """What an uncommitted step held, to delete after the new commit or to put back should it fail."""

    manifest: Manifest
    raw_manifest: bytes
    raw_metadata: bytes | None


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


def uncommit(storage: Storage, step: int, *, save_id: int,
             may_replace: Callable[[Manifest | None], bool]) -> Superseded | None:
    """Delete the manifest of ``step`` if ``may_replace`` allows it (it gets None for an unreadable one) and it is
    not ``save_id``'s own; return what it held (None: nothing). CommitError when the step is someone else's."""
    try:
        raw = storage.get(manifest_key(step))
    except NotFoundError:
        return None
    try:
        manifest: Manifest | None = Manifest.from_json(raw, key=manifest_key(step))
    except CorruptCheckpointError:
        manifest = None
    if manifest is not None and manifest.save_id == save_id:
        return None  # a retried commit of this very save
    if not may_replace(manifest):
        # Never touch .metadata of a step another save committed (a second job racing on this root).
        raise CommitError("step is already committed by another save", root=storage.url, step=step)
    if manifest is None:
        storage.delete(manifest_key(step))  # unreadable: nothing to keep or to put back
        return None
    try:
        metadata: bytes | None = storage.get(join_key(step_dir(step), METADATA))
    except StorageError:
        metadata = None
    storage.delete(manifest_key(step))
    return Superseded(manifest=manifest, raw_manifest=raw, raw_metadata=metadata)


def reinstate(storage: Storage, step: int, old: Superseded) -> None:
    """Best effort: the new commit failed after ``uncommit``; make the old save committed again."""
    with contextlib.suppress(StorageError):
        if old.raw_metadata is not None:
            storage.put(join_key(step_dir(step), METADATA), old.raw_metadata)
        storage.put(manifest_key(step), old.raw_manifest, mode="create")


def drop_superseded(storage: Storage, step: int, old: Superseded, new: Manifest) -> None:
    """After the new commit: delete the old save's data files that the new manifest does not list."""
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
