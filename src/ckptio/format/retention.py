"""Retention: which steps and leftovers to delete, and in which order.

A step's manifest is deleted first, so an interrupted deletion leaves an uncommitted (ignored) directory, never a
committed one with holes. The newest committed step is never deleted.

Containment: deleting a step touches only keys that belong to it, its directory ``step-XXXXXXXX/`` and hashed data
``h-<hex>/step-XXXXXXXX/<name>``. A manifest's keys are followed only after :meth:`Manifest.from_json` checked that
each one is of that form; a manifest that names anything else is never followed (the step's own keys are found by
listing instead). Storage backends refuse keys that leave the root (POSIX: through a symlink).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ckptio.errors import CheckpointNotFoundError, CorruptCheckpointError, NotFoundError, StorageError
from ckptio.format.commit import all_step_dirs, committed_steps, failure_markers, read_manifest
from ckptio.format.keys import hash_prefix_enabled, manifest_key, step_dir
from ckptio.format.records import Manifest
from ckptio.storage.base import HASHED_DIR_PREFIX, Storage, join_key


def delete_step(storage: Storage, step: int) -> None:
    """Manifest first: a half-deleted step is uncommitted, never a committed step with missing files."""
    hashed: list[str] | None
    try:
        # read_manifest has checked every key: each is this step's own (h-<hex>/step-XXXXXXXX/<name>).
        hashed = [rec.key for rec in read_manifest(storage, step).files.values() if rec.key]
    except CheckpointNotFoundError:
        hashed = []
    except CorruptCheckpointError:
        hashed = None  # never follow a manifest that failed its checks: find the step's own keys by listing
    storage.delete(manifest_key(step))
    for key in hashed or ():
        storage.delete(key)
    if hashed is None:
        _delete_own_hashed(storage, step)
    storage.delete_prefix(step_dir(step))


def _delete_own_hashed(storage: Storage, step: int) -> None:
    if hash_prefix_enabled(storage):  # hashed data lives outside the step directory, under h-<hex>/<step dir>/
        for top in storage.list_dirs(""):
            if top.startswith(HASHED_DIR_PREFIX):
                storage.delete_prefix(join_key(top, step_dir(step)))


def _delete_uncommitted(storage: Storage, step: int) -> None:
    storage.delete_prefix(step_dir(step))
    _delete_own_hashed(storage, step)


def apply_retention(storage: Storage, *, keep_last: int, newest_committed: int,
                    markers_kept_s: float = 0.0) -> list[int]:
    """Delete committed steps beyond ``keep_last`` and uncommitted leftovers older than ``newest_committed``.

    Uncommitted directories newer than the newest commit may belong to a save in flight and are left alone, and so
    are those holding a failure or drop marker younger than ``markers_kept_s`` (see :func:`has_fresh_marker`).
    Returns the steps removed.
    """
    committed = committed_steps(storage)
    if newest_committed not in committed:
        return []  # never delete before the newer step is committed
    removed: list[int] = []
    first_error: StorageError | None = None

    def attempt(delete: Callable[[Storage, int], None], step: int) -> None:
        # One step that cannot be deleted (a symlink the storage refuses, a transient error) must not stop
        # retention of the others: leftovers that are never removed end up filling the disk.
        nonlocal first_error
        try:
            delete(storage, step)
            removed.append(step)
        except StorageError as exc:
            first_error = first_error or exc

    retired: dict[int, int] = {}
    if keep_last > 0:
        for step in committed[:-keep_last]:
            if step != newest_committed:
                with_id = _save_id(storage, step)
                attempt(delete_step, step)
                if step in removed and with_id is not None:
                    retired[step] = with_id
    if retired:
        _record_retired(storage, retired)
    for step in all_step_dirs(storage):
        if step < newest_committed and step not in committed and not has_fresh_marker(storage, step, markers_kept_s):
            attempt(_delete_uncommitted, step)
    if first_error is not None:
        raise first_error
    return sorted(removed)


def has_fresh_marker(storage: Storage, step: int, kept_s: float) -> bool:
    """Does ``step`` hold a failure or drop marker written less than ``kept_s`` ago?

    The marker is how every rank learns that an attempt will not commit, and a rank whose watcher lags behind rank
    0 (it still writes, or watches an earlier step) reads it only later. Rank 0 can commit the next step meanwhile;
    deleting the dropped step's directory then would leave that rank watching for a manifest that never comes, and
    report a dropped save as a commit failure after ``commit_timeout_s``. So a marker stays for that long. A marker
    without a readable time counts as old (a crashed run's leftover must not stay forever).
    """
    if kept_s <= 0:
        return False
    now = time.time()
    for _who, body in failure_markers(storage, step):
        try:
            written = float(body["time"])
        except (ValueError, TypeError, KeyError):
            continue
        if now - written < kept_s:
            return True
    return False


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


RETIRED = "retired.json"
"""Root-level record of the newest committed steps retention deleted (step → save id), so that a rank whose watcher
lags behind rank 0 learns its save committed even after retention removed the step (keep_last=1, fast saves)."""
_RETIRED_KEPT = 256


def _save_id(storage: Storage, step: int) -> int | None:
    try:
        return read_manifest(storage, step).save_id
    except (CheckpointNotFoundError, CorruptCheckpointError, StorageError):
        return None


def read_retired(storage: Storage) -> dict[int, int]:
    """Step → save id of committed steps retention deleted recently (empty when there is no valid record)."""
    try:
        body = json.loads(storage.get(RETIRED))
        return {int(k): int(v) for k, v in body.items()}
    except (NotFoundError, StorageError, ValueError, TypeError, AttributeError):
        return {}


def _record_retired(storage: Storage, retired: dict[int, int]) -> None:
    merged = {**read_retired(storage), **retired}
    newest = dict(sorted(merged.items())[-_RETIRED_KEPT:])
    storage.put(RETIRED, json.dumps({str(k): v for k, v in newest.items()}).encode())
