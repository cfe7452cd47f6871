"""Restore: pick the step every rank will load, then let DCP's load planner (resharding included) read it through
ckptio's StorageReader (:mod:`ckptio.engine.restore.storage_reader`): ranged reads into the targets, checksums on every
block, each range read from the store by one rank and sent to the others that need it, an intact local copy preferred.

Runs on the training thread; its only collectives are the step broadcast, the readiness gate
(:mod:`ckptio.engine.restore.readiness`) and those inside ``dcp.load`` (planning, and the reader's exchange of
ranges), all on ckptio's side group. It runs no code from the store unless
``trust_pickles`` says so (docs/security.md): the reader unpickles ``.metadata`` and values with allowlists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ckptio import format as fmt
from ckptio.engine.restore.context import RestoreContext
from ckptio.engine.restore.dcp_load import load_through
from ckptio.engine.restore.readiness import check_ready, rank0_choice
from ckptio.engine.restore.storage_reader import CkptioStorageReader
from ckptio.errors import CheckpointNotFoundError
from ckptio.format import Manifest
from ckptio.format.plain_dcp import is_plain_dcp
from ckptio.storage.base import ReadStore, Storage, join_key

log = logging.getLogger("ckptio")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a ``restore`` read: the step (None: nothing to restore), the level it came from, and per source
    (``local``, ``partner``, ``durable``) how many files it read there; ``note`` says why a newer step or a faster
    level was set aside, or that the step is a plain DCP checkpoint."""

    step: int | None
    level: str
    """``durable``, ``local``, ``dcp`` (a plain DCP checkpoint in the durable root, no ckptio manifest) or
    ``none``."""
    sources: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class DurableStep:
    """A step restore can load from the durable root: committed by ckptio, or a plain DCP checkpoint."""

    step: int
    plain: bool


def choose_durable(storage: Storage, step: int | None) -> DurableStep | None:
    """Rank 0: the newest step of the durable root — committed, or a plain DCP checkpoint newer than every
    committed one (:mod:`ckptio.format.plain_dcp`) — or ``step`` when it is either. A plain DCP checkpoint is never
    skipped: a user moving from ``dcp.save`` restores their last checkpoint. The newest is found from one listing,
    walking down from the newest directory (a save in flight is neither, and is passed), so the lookups do not grow
    with the steps the root keeps."""
    if step is None:
        for newest in reversed(fmt.all_step_dirs(storage)):
            if storage.exists(fmt.manifest_key(newest)):
                return DurableStep(newest, False)
            if is_plain_dcp(storage, newest):
                return DurableStep(newest, True)
        return None
    if storage.exists(fmt.manifest_key(step)):
        return DurableStep(step, False)
    if is_plain_dcp(storage, step):
        return DurableStep(step, True)
    raise CheckpointNotFoundError(
        f"no committed checkpoint for this step: {fmt.step_dir(step)}/{fmt.MANIFEST} is missing, and the directory "
        "is not a plain DCP checkpoint either (a .metadata without ckptio's rank indexes)", root=storage.url,
        step=step)


@dataclass(frozen=True, slots=True)
class ChosenStep:
    """Rank 0's choice with the records every rank reads next, read once for the job and broadcast: each rank
    reading them was N reads of the same objects, each a round trip every rank waited on at the readiness gate.
    A record rank 0 could not read is None, and every rank reads (and fails on) its own as before."""

    durable: DurableStep
    manifest: Manifest | None
    metadata: bytes | None


def read_or_none(storage: ReadStore, read: Callable[[ReadStore, int], T], step: int) -> T | None:
    """``read(storage, step)``, or None when it raises: the rank that needs it reads it again and fails there."""
    try:
        return read(storage, step)
    except Exception:  # every rank reads it again itself and reports what stops it at the gate
        return None


def raw_metadata(storage: ReadStore, step: int) -> bytes:
    return storage.get(join_key(fmt.step_dir(step), fmt.METADATA))


def _choose_with_records(storage: Storage, step: int | None) -> ChosenStep | None:
    chosen = choose_durable(storage, step)
    if chosen is None:
        return None
    with ThreadPoolExecutor(2, thread_name_prefix="ckptio-choice") as pool:
        manifest = None if chosen.plain else pool.submit(read_or_none, storage, fmt.read_manifest, chosen.step)
        metadata = pool.submit(read_or_none, storage, raw_metadata, chosen.step)
        return ChosenStep(chosen, manifest.result() if manifest else None, metadata.result())


def restore_step(ctx: RestoreContext, state: dict[str, Any], *, step: int | None = None) -> RestoreReport:
    """Load the newest step of ``ctx.durable`` (or ``step``) into ``state``, every rank of ``ctx.group`` together
    (:func:`choose_durable`: a plain DCP checkpoint is read through the same reader, and the report says so).

    Rank 0 chooses the step and reads its records, and broadcasts them (what stops it there is broadcast too, since
    the others wait for it; a record it could not read, each rank reads itself); then every rank checks the
    records, and a rank that cannot fails every rank at the readiness gate (:mod:`ckptio.engine.restore.readiness`),
    before DCP's planning."""
    t0 = time.monotonic()
    group = ctx.group
    choice = rank0_choice(group, lambda: _choose_with_records(ctx.durable, step))
    if choice is None:
        return RestoreReport(step=None, level="none", seconds=time.monotonic() - t0)
    chosen = choice.durable
    reader, error = None, None
    try:
        manifest = choice.manifest
        if manifest is None and not chosen.plain:
            manifest = fmt.read_manifest(ctx.durable, chosen.step)
        reader = CkptioStorageReader.in_context(ctx, chosen.step, manifest)
        reader.given_metadata(choice.metadata)
        reader.read_metadata()  # UntrustedCheckpointError, ChecksumError … raised at the gate, not wrapped by DCP
    except Exception as exc:  # reported to every rank at the gate, then raised here as it is
        error = exc
    check_ready(group, error, timeout_s=ctx.options.ready_timeout_s, step=chosen.step)
    assert reader is not None
    load_through(reader, state, process_group=ctx.process_group, step=chosen.step)
    note = None
    if chosen.plain:
        note = (f"step {chosen.step} is a plain DCP checkpoint ({fmt.step_dir(chosen.step)} has no ckptio manifest): "
                "restored through ckptio's reader, each item checked against the zip CRC-32s torch.save keeps")
        log.info("ckptio: %s", note)
    return RestoreReport(step=chosen.step, level="dcp" if chosen.plain else "durable", note=note,
                         seconds=time.monotonic() - t0)
