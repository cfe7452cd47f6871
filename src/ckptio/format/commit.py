"""The commit protocol on storage: failure markers, the create-only manifest, ``latest`` and committed steps.

A step is committed iff ``step-XXXXXXXX/manifest.json`` exists. It is written last and create-only, after every
rank's index (which is written after that rank's data is durable) and after ``.metadata``. Everything here is
written against the :class:`~ckptio.storage.Storage` protocol, so POSIX and S3 share one implementation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from ckptio.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    CommitError,
    CorruptCheckpointError,
    NotFoundError,
    PreconditionError,
    StorageError,
)
from ckptio.format.keys import FAILED_DIR, LATEST, MANIFEST, failed_key, manifest_key, parse_step_dir, step_dir
from ckptio.format.records import Manifest
from ckptio.format.supersede import pending_supersede, resolve
from ckptio.storage.base import IfMatch, ReadStore, Storage, join_key


def write_failure(storage: Storage, step: int, who: str, save_id: int, error: BaseException | str, *,
                  dropped: bool = False) -> None:
    """Tell the committer and the other ranks' watchers that this save attempt cannot commit. ``dropped``: no
    rank failed, the attempt is given up on purpose (a rank had no free staging slot, or refused the save), so the
    other ranks report it as skipped, not failed."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    body = {"save_id": save_id, "error": text, "time": time.time(), "dropped": dropped}
    try:
        storage.put(failed_key(step, who), json.dumps(body).encode())
    except StorageError:
        pass  # the committer's timeout is the fallback


def failure_markers(storage: Storage, step: int) -> Iterator[tuple[str, Any]]:
    """Every readable marker of ``step``, of any attempt: (who, parsed body); unreadable ones are skipped."""
    for info in storage.list(join_key(step_dir(step), FAILED_DIR) + "/"):
        try:
            body = json.loads(storage.get(info.key))
        except (StorageError, ValueError):
            continue
        yield info.key.rsplit("/", 1)[-1].removesuffix(".json"), body


def read_failure_markers(storage: Storage, step: int, save_id: int) -> list[tuple[str, bool]]:
    """The markers of attempt ``save_id`` of ``step``: ("who: error", dropped) each."""
    return [(f"{who}: {body.get('error')}", bool(body.get("dropped")))
            for who, body in failure_markers(storage, step) if body.get("save_id") == save_id]


def read_failures(storage: Storage, step: int, save_id: int) -> list[str]:
    return [text for text, _ in read_failure_markers(storage, step, save_id)]


def write_manifest(storage: Storage, manifest: Manifest, *, verify: bool = False) -> None:
    """Create-only write of the manifest: the commit point.

    ``verify`` (``commit="lease"``, for stores that ignore create-only writes): read the manifest back after
    writing it and raise CommitError unless it is this save's. That catches a writer that overwrote ours before
    the read; it cannot stop a writer that overwrites ours after it (the ownership lease is what keeps others
    out of the root), which is why lease mode is weaker than a store that honours If-None-Match.
    """
    key = manifest_key(manifest.step)
    body = manifest.to_json()
    try:
        storage.put(key, body, mode="create")
        if verify:
            _verify_manifest(storage, manifest, key)
    except AlreadyExistsError as exc:
        # A retried create may find its own earlier write: same save_id means it is ours.
        try:
            existing = Manifest.from_json(storage.get(key), key=key)
        except (StorageError, CorruptCheckpointError):
            existing = None
        if existing is not None and existing.save_id == manifest.save_id:
            return
        raise CommitError(
            "step is already committed by another save", root=storage.url, step=manifest.step, path=key
        ) from exc


def replace_manifest(storage: Storage, manifest: Manifest, *, etag: str, verify: bool = False) -> None:
    """The commit point of a supersede: replace the step's manifest while it is still the one read (``etag``),
    else CommitError (another writer changed it meanwhile). ``verify`` as for :func:`write_manifest`."""
    key = manifest_key(manifest.step)
    try:
        storage.put(key, manifest.to_json(), mode=IfMatch(etag))
    except PreconditionError as exc:
        raise CommitError("the step's manifest changed while this save superseded it", root=storage.url,
                          step=manifest.step, path=key) from exc
    if verify:
        _verify_manifest(storage, manifest, key)


def _verify_manifest(storage: Storage, manifest: Manifest, key: str) -> None:
    """Read-after-write check of lease mode: the manifest at ``key`` is this save's, or CommitError."""
    try:
        stored = Manifest.from_json(storage.get(key), key=key)
    except (StorageError, CorruptCheckpointError) as exc:
        raise CommitError(f"the manifest just written cannot be read back ({exc}); commit='lease' cannot confirm "
                          "the commit", root=storage.url, step=manifest.step, path=key) from exc
    if stored.save_id != manifest.save_id:
        raise CommitError("another writer replaced this step's manifest right after it was written (read-after-write "
                          "check of commit='lease')", root=storage.url, step=manifest.step, path=key)


def read_manifest(storage: ReadStore, step: int) -> Manifest:
    """The manifest of committed ``step``: ``manifest.json``, or — while a supersede of the step is in progress or
    was interrupted by a crash — whichever of its old and new manifests pairs with the ``.metadata`` in place
    (``format.supersede``)."""
    return step_manifests(storage, step)[0]


def step_manifests(storage: ReadStore, step: int) -> list[Manifest]:
    """:func:`read_manifest`'s manifest first, then, during a supersede, the other side's (both sides' files belong
    to the step until the supersede is finished). CheckpointNotFoundError / CorruptCheckpointError for the first."""
    key = manifest_key(step)
    try:
        raw = storage.get(key)
    except NotFoundError:
        raise CheckpointNotFoundError("no committed checkpoint for this step", root=storage.url, step=step) from None
    pending = pending_supersede(storage, step)
    if pending is None:
        return [_parse_manifest(storage, step, raw)]
    chosen = resolve(storage, step, raw, pending)
    others = []
    for other in {raw, pending.new, pending.old} - {chosen}:
        if other is None:
            continue
        try:
            others.append(_parse_manifest(storage, step, other))
        except CorruptCheckpointError:
            continue
    return [_parse_manifest(storage, step, chosen), *others]


def _parse_manifest(storage: ReadStore, step: int, raw: bytes) -> Manifest:
    key = manifest_key(step)
    try:
        manifest = Manifest.from_json(raw, key=key)
    except CorruptCheckpointError as exc:
        exc.root, exc.step = storage.url, step
        raise
    if manifest.step != step:
        # A manifest copied from another step would make this step's retention and restore act on that one's files.
        raise CorruptCheckpointError(f"manifest of step {step} says step {manifest.step}", root=storage.url,
                                     step=step, path=key)
    return manifest


def committed_steps(storage: Storage) -> list[int]:
    """Steps whose manifest exists, ascending."""
    steps = []
    for name in storage.list_dirs(""):
        step = parse_step_dir(name)
        if step is not None and storage.exists(join_key(name, MANIFEST)):
            steps.append(step)
    return sorted(steps)


def all_step_dirs(storage: Storage) -> list[int]:
    return sorted(s for s in (parse_step_dir(n) for n in storage.list_dirs("")) if s is not None)


def newest_committed_step(storage: Storage) -> int | None:
    """The newest step whose manifest exists, or None. One listing, then one lookup per directory from the newest
    down (one, unless saves are in flight), where :func:`committed_steps` looks up every directory: a restore's
    choice waits on each, and a root keeping many steps on a loaded store made that seconds."""
    for step in reversed(all_step_dirs(storage)):
        if storage.exists(manifest_key(step)):
            return step
    return None


def update_latest(storage: Storage, step: int) -> None:
    """Move the advisory ``latest`` pointer forward with compare-and-swap; never backwards."""
    for _ in range(5):
        try:
            info = storage.head(LATEST)
            current = int(storage.get(LATEST).strip() or b"-1")
        except NotFoundError:
            info, current = None, -1
        except ValueError:
            info, current = storage.head(LATEST), -1
        if current >= step:
            return
        try:
            if info is None:
                storage.put(LATEST, str(step).encode(), mode="create")
            else:
                storage.put(LATEST, str(step).encode(), mode=IfMatch(info.etag))
            return
        except (AlreadyExistsError, PreconditionError):
            continue


def read_latest(storage: Storage) -> int | None:
    try:
        return int(storage.get(LATEST).strip())
    except (NotFoundError, ValueError):
        return None
