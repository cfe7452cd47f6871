"""Retention: which steps and leftovers to delete, and in which order.

A step's manifest is deleted first, so an interrupted deletion leaves an uncommitted (ignored) directory, never a
committed one with holes. The newest committed step is never deleted.
"""

from __future__ import annotations

from ckptio.errors import CheckpointNotFoundError, CorruptCheckpointError
from ckptio.format.commit import all_step_dirs, committed_steps, read_manifest
from ckptio.format.keys import hash_prefix_enabled, manifest_key, step_dir
from ckptio.format.records import Manifest
from ckptio.storage.base import Storage, join_key


def delete_step(storage: Storage, step: int) -> None:
    """Manifest first: a half-deleted step is uncommitted, never a committed step with missing files."""
    try:
        hashed = [rec.key for rec in read_manifest(storage, step).files.values() if rec.key]
    except (CheckpointNotFoundError, CorruptCheckpointError):
        hashed = []
    storage.delete(manifest_key(step))
    for key in hashed:
        storage.delete(key)
    storage.delete_prefix(step_dir(step))


def _delete_uncommitted(storage: Storage, step: int) -> None:
    storage.delete_prefix(step_dir(step))
    if hash_prefix_enabled(storage):  # hashed data of a failed attempt lives outside the step directory
        for top in storage.list_dirs(""):
            if top.startswith("h-"):
                storage.delete_prefix(join_key(top, step_dir(step)))


def apply_retention(storage: Storage, *, keep_last: int, newest_committed: int) -> list[int]:
    """Delete committed steps beyond ``keep_last`` and uncommitted leftovers older than ``newest_committed``.

    Uncommitted directories newer than the newest commit may belong to a save in flight and are left alone.
    Returns the steps removed.
    """
    committed = committed_steps(storage)
    if newest_committed not in committed:
        return []  # never delete before the newer step is committed
    removed = []
    if keep_last > 0:
        for step in committed[:-keep_last]:
            if step != newest_committed:
                delete_step(storage, step)
                removed.append(step)
    for step in all_step_dirs(storage):
        if step < newest_committed and step not in committed:
            _delete_uncommitted(storage, step)
            removed.append(step)
    return sorted(removed)


def remove_unlisted_files(storage: Storage, manifest: Manifest) -> list[str]:
    """Delete data files of earlier attempts at a committed step (the manifest lists the ones that count)."""
    base = step_dir(manifest.step)
    removed = []
    for info in storage.list(base + "/"):
        name = info.key[len(base) + 1 :]
        if name.endswith(".distcp") and "/" not in name and name not in manifest.files:
            storage.delete(info.key)
            removed.append(name)
    return removed
