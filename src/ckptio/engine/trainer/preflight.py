"""What a Checkpointer does with its roots before it writes anything: open them (:func:`open_stores`), then check
the durable one (residency, capabilities, volumes, one test write) and claim it.

Owns the order and the verdict: residency first (reads only; on by default, so a public bucket is refused
unless ``allow_public=True``), then the store's capabilities (:mod:`ckptio.storage.capabilities`, which writes
only its own sentinel objects and removes them). A store that does not honour the conditional writes the commit
rests on is refused with :class:`~ckptio.errors.StoreCapabilityError` unless the config opts into
``commit="lease"``; there is no silent downgrade. Then the volume policy of a POSIX root, and a small write and
delete, so that a root that cannot be written fails at construction, not at the first background save. Runs on
rank 0 only (the Checkpointer shares the verdict). It must never write a checkpoint byte, and never change a
store setting.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets

from ckptio.config import CheckpointerConfig
from ckptio.engine.owner_record import OwnerRecord, claim_root, release_root
from ckptio.engine.side_group import SaveIds, SideGroup
from ckptio.errors import CkptError, StoreCapabilityError
from ckptio.policy.residency import check_residency, resolve_residency
from ckptio.policy.volumes import enforce_volume_policy
from ckptio.storage import PosixRoot, open_storage, parse_root
from ckptio.storage.base import Storage
from ckptio.storage.capabilities import StoreCapabilities, capability_problems, detect_capabilities

log = logging.getLogger("ckptio")


def open_stores(config: CheckpointerConfig, undo: contextlib.ExitStack) -> tuple[Storage, Storage | None]:
    """The durable root and the local level's directory (None without one). A store this opens is closed by
    ``undo``; a ``Storage`` the caller passed is the caller's to close. A POSIX root path fsyncs as
    ``config.fsync`` says unless its ``storage_options`` say otherwise; the local level never fsyncs (its copies
    on partner nodes are what survive a crash)."""
    options = dict(config.storage_options)
    if isinstance(config.root, (str, os.PathLike)) and isinstance(parse_root(config.root), PosixRoot):
        options.setdefault("fsync", config.fsync)
    storage = open_storage(config.root, **options)
    if not isinstance(config.root, Storage):
        undo.callback(storage.close)
    local: Storage | None = None
    if config.local_dir is not None:
        local = open_storage(config.local_dir, fsync=False)
        if not isinstance(config.local_dir, Storage):
            undo.callback(local.close)
    return storage, local


def preflight(storage: Storage, config: CheckpointerConfig, group: SideGroup,
              resources: contextlib.ExitStack) -> tuple[OwnerRecord | None, SaveIds]:
    """Every rank together: rank 0 checks the store (:func:`check_store`) and claims the root (its release
    registered on ``resources``); every rank gets the verdict, raised on each, and the run's save ids (rank 0's
    nonce: ``group.SaveIds``). Returns rank 0's owner record (None elsewhere, or without a lease)."""
    error: CkptError | None = None
    owner: OwnerRecord | None = None
    nonce = secrets.randbits(48)
    if group.rank == 0:
        try:
            check_store(storage, config)
            if config.lease_s > 0:
                owner = claim_root(storage, lease_s=config.lease_s, job_id=config.job_id)
                resources.callback(release_root, storage, owner)
        except CkptError as exc:
            error = exc
    error, nonce = group.broadcast_from_rank0((error, nonce))
    if error is not None:
        raise error
    return owner, SaveIds(nonce)


def check_store(storage: Storage, config: CheckpointerConfig) -> StoreCapabilities | None:
    """Raise ResidencyError or StoreCapabilityError when ``storage`` may not take this job's checkpoints.

    Returns the store's capabilities (None for a POSIX directory, whose create-only and compare-and-swap writes
    are system calls the backend itself makes atomic: there is nothing to detect).
    """
    check_residency(storage, resolve_residency(config.residency, allow_public=config.allow_public,
                                               store_private=config.store_private))
    directory = storage.local_directory()
    caps = None if directory is not None else _check_capabilities(storage, config)
    if directory is not None:
        enforce_volume_policy(directory.root, config.data_dirs, mode=config.volume_check)
    key = f".ckptio-write-test-{os.getpid()}"
    storage.put(key, b"ok")
    storage.delete(key)
    return caps


def _check_capabilities(storage: Storage, config: CheckpointerConfig) -> StoreCapabilities:
    caps = detect_capabilities(storage)
    problems = capability_problems(caps, commit=config.commit)
    if problems:
        raise StoreCapabilityError(" ".join(problems), root=storage.url)
    if not caps.conditional_writes:
        log.warning("ckptio: %s ignores conditional writes; commit='lease' relies on the ownership lease and a "
                    "read-after-write check of each manifest (docs/s3.md, 'Lease mode')", storage.url)
    return caps
