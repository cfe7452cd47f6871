"""Retention and leftover cleanup: which steps and keys to delete, and in which order.

A step's manifest is deleted first, so an interrupted deletion leaves an uncommitted (ignored) directory, never a
committed one with holes. The newest committed step is never deleted.

**Cost.** What runs after every commit (:func:`retain`) is driven by the records the commit already keeps — the
committed steps the committer knows, each deleted step's own manifest — and never lists the root: its metadata
operations depend on the steps it deletes, not on how many steps the root holds. Leftovers of crashed or failed
attempts are found by listing (:func:`remove_leftovers`), which the committer runs at start, at close, and after an
attempt of its own failed, never on every commit. :func:`apply_retention` is both at once, for tools.

**Nothing ckptio did not write is deleted.** Within a step directory only the keys ``keys.is_own_key`` names go
(with ``.metadata`` when nothing foreign stays beside it), plus the files the step's own manifest lists; a
directory that holds none of ckptio's keys — a plain DCP checkpoint, a user's folder — is never touched.

Containment: deleting a step touches only keys that belong to it, in its directory ``step-XXXXXXXX/`` and hashed
data ``h-<hex>/step-XXXXXXXX/<name>``. A manifest's keys are followed only after :meth:`Manifest.from_json` checked
that each one is of that form; a manifest that names anything else is never followed (the step's own keys are found
by listing instead). Storage backends refuse keys that leave the root (POSIX: through a symlink).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence

from ckptio.errors import CheckpointNotFoundError, CorruptCheckpointError, NotFoundError, StorageError
from ckptio.format.commit import all_step_dirs, committed_steps, failure_markers, step_manifests
from ckptio.format.keys import hash_prefix_enabled, manifest_key, own_keys_to_delete, step_dir
from ckptio.format.records import Manifest, record_key
from ckptio.storage.base import HASHED_DIR_PREFIX, Storage, join_key


def delete_step(storage: Storage, step: int) -> int | None:
    """Delete committed ``step``: its manifest first (a half-deleted step is uncommitted, never a committed step with
    missing files), then the files its manifests list, then ckptio's own keys left in its directory. Returns the save
    id of the manifest it deleted (None: none was readable)."""
    manifests: list[Manifest] | None
    try:
        # Parsing checked every key: each is this step's own (step-XXXXXXXX/<name>, h-<hex>/...). A supersede a
        # crash interrupted lists two saves, and both sides' files are the step's.
        manifests = step_manifests(storage, step)
    except CheckpointNotFoundError:
        manifests = []
    except CorruptCheckpointError:
        manifests = None  # never follow a manifest that failed its checks: find the step's own keys by listing
    storage.delete(manifest_key(step))
    # A file held on nodes (the local level's records) was never written under the root: nothing to delete there.
    for key in sorted({record_key(step, rec) for m in manifests or () for rec in m.files.values() if not rec.holders}):
        storage.delete(key)
    if manifests is None:
        _delete_own_hashed(storage, step)
    delete_own_keys(storage, step)
    return manifests[0].save_id if manifests else None


def delete_own_keys(storage: Storage, step: int) -> int:
    """Delete the keys of ``step``'s directory that ckptio writes (``keys.own_keys_to_delete``); returns how many."""
    base = step_dir(step) + "/"
    rests = [info.key[len(base):] for info in storage.list(base)]
    doomed = own_keys_to_delete(rests)
    for rest in doomed:
        storage.delete(base + rest)
    return len(doomed)


def _delete_own_hashed(storage: Storage, step: int) -> None:
    if hash_prefix_enabled(storage):  # hashed data lives outside the step directory, under h-<hex>/<step dir>/
        for top in storage.list_dirs(""):
            if top.startswith(HASHED_DIR_PREFIX):
                storage.delete_prefix(join_key(top, step_dir(step)))


def _delete_uncommitted(storage: Storage, step: int) -> None:
    if delete_own_keys(storage, step):
        _delete_own_hashed(storage, step)


def retain(storage: Storage, *, committed: Sequence[int], keep_last: int, newest_committed: int) -> list[int]:
    """After the commit of ``newest_committed``: delete the committed steps beyond ``keep_last`` among
    ``committed`` (the steps the committer knows are committed, ascending), never the newest, and record them in
    ``retired.json``. Lists nothing. Returns the steps removed."""
    if newest_committed not in committed or keep_last <= 0:
        return []  # never delete before the newer step is committed
    removed, retired, error = _attempt_each(storage, [s for s in committed[:-keep_last] if s != newest_committed],
                                            delete_step)
    if retired:
        _record_retired(storage, retired)
    if error is not None:
        raise error
    return removed


def remove_leftovers(storage: Storage, *, below: int, committed: Collection[int], live: Collection[int] = (),
                     markers_kept_s: float = 0.0) -> list[int]:
    """Delete ckptio's keys of uncommitted step directories below ``below`` (a crashed or failed attempt's data,
    indexes and markers). Lists the root, so it never runs on every commit. Directories newer than the newest commit
    may belong to a save in flight and are left alone, as are ``live`` steps, those holding a failure or drop marker
    younger than ``markers_kept_s`` (see :func:`has_fresh_marker`), and any directory ckptio did not write."""
    doomed = [step for step in all_step_dirs(storage) if step < below and step not in committed
              and step not in live and not has_fresh_marker(storage, step, markers_kept_s)]
    removed, _, error = _attempt_each(storage, doomed, _delete_uncommitted)
    if error is not None:
        raise error
    return removed


def apply_retention(storage: Storage, *, keep_last: int, newest_committed: int,
                    markers_kept_s: float = 0.0) -> list[int]:
    """:func:`retain` over the committed steps listed from the root, then :func:`remove_leftovers` below
    ``newest_committed`` (tools and tests; the committer runs the two apart). Returns the steps removed."""
    committed = committed_steps(storage)
    if newest_committed not in committed:
        return []
    removed = retain(storage, committed=committed, keep_last=keep_last, newest_committed=newest_committed)
    left = set(committed) - set(removed)
    return sorted(removed + remove_leftovers(storage, below=newest_committed, committed=left,
                                             markers_kept_s=markers_kept_s))


def _attempt_each(storage: Storage, steps: list[int], delete: Callable[[Storage, int], int | None],
                  ) -> tuple[list[int], dict[int, int], StorageError | None]:
    """Delete each step: the steps removed, their save ids, and the first error (to raise once all were tried).

    One step that cannot be deleted (a symlink the storage refuses, a transient error) must not stop the others:
    leftovers that are never removed end up filling the disk."""
    removed: list[int] = []
    save_ids: dict[int, int] = {}
    first_error: StorageError | None = None
    for step in steps:
        try:
            save_id = delete(storage, step)
        except StorageError as exc:
            first_error = first_error or exc
            continue
        removed.append(step)
        if save_id is not None:
            save_ids[step] = save_id
    return removed, save_ids, first_error


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
    """Delete data files of earlier attempts at a committed step (the manifest lists the ones that count); only
    names ckptio writes, never a file of someone else's in the directory."""
    base = step_dir(manifest.step)
    rests = [info.key[len(base) + 1 :] for info in storage.list(base + "/")]
    removed = [rest for rest in own_keys_to_delete(rests)
               if rest.endswith(".distcp") and "/" not in rest and rest not in manifest.files]
    for name in removed:
        storage.delete(join_key(base, name))
    return removed


RETIRED = "retired.json"
"""Root-level record of the newest committed steps retention deleted (step → save id), so that a rank whose watcher
lags behind rank 0 learns its save committed even after retention removed the step (keep_last=1, fast saves)."""
_RETIRED_KEPT = 256


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
