"""Restore with two levels: pick the newest restorable step, then read each file from the fastest intact copy —
this node's local dir, a partner node's copy over the network, the durable level — checksums gating each.

Rank 0 picks the candidates (newest durable step, newest committed local-level step) while every node reports what
its local dir holds and a lost node's files are pushed back to it (:mod:`~ckptio.engine.restore.early_push`); the
local step wins when it is at least as new as the durable one and every file is held somewhere (or the same save is
durable too). A restore at another world size, a local step with a file held nowhere, or a copy that fails its
checksum on every source falls back to the durable level, and the ``restored`` event and the log say why. A state
that does not match the checkpoint is never a reason to fall back: it raises
:class:`~ckptio.errors.StructureMismatchError` naming the key, whatever the level. All collectives run on the side
group, from the training thread (the pushes' point-to-point transfers on a group of their own).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ckptio import format as fmt
from ckptio.engine.restore.context import RestoreContext
from ckptio.engine.restore.dcp_load import load_through
from ckptio.engine.restore.early_push import EarlyPush, Held
from ckptio.engine.restore.levels_storage_reader import LevelsStorageReader
from ckptio.engine.restore.readiness import gather_ready, rank0_choice
from ckptio.engine.restore.step_restore import (
    RestoreReport,
    choose_durable,
    raw_metadata,
    read_or_none,
    restore_step,
)
from ckptio.errors import (
    CheckpointNotFoundError,
    CkptError,
    CorruptCheckpointError,
    PeerLostError,
    StructureMismatchError,
)
from ckptio.format import Manifest
from ckptio.storage.base import Storage

log = logging.getLogger("ckptio")


@dataclass(frozen=True, slots=True)
class _Decision:
    """Rank 0's choice, broadcast to every rank: the candidates of each level, and why a local one was set aside."""

    durable: int | None
    local: Manifest | None
    durable_fallback: bool = False
    """The local step's save is also committed on the durable level: a file lost on every node is read there."""
    note: str | None = None
    metadata: bytes | None = None
    """The local step's ``.metadata`` as rank 0 read it (:class:`~ckptio.engine.restore.step_restore.ChosenStep`)."""


def _given_step(pool: ThreadPoolExecutor, durable: Storage, records: Storage,
                step: int) -> tuple[int | None, int | None]:
    """Rank 0, for a requested ``step``: whether the durable level has it (committed, or plain DCP) and whether the
    local level has it, looked up side by side."""
    on_durable = pool.submit(choose_durable, durable, step)
    on_local = pool.submit(records.exists, fmt.manifest_key(step))
    try:  # committed on the durable level, or a plain DCP checkpoint there
        candidate: int | None = step if on_durable.result() is not None else None
    except CheckpointNotFoundError:
        candidate = None
    local_step = step if on_local.result() else None
    if candidate is None and local_step is None:
        raise CheckpointNotFoundError("no committed checkpoint for this step on any level", root=durable.url,
                                      step=step)
    return candidate, local_step


def _read_local(pool: ThreadPoolExecutor, records: Storage, step: int) -> tuple[Manifest, bytes | None]:
    """The local step's manifest and ``.metadata``, read side by side (CheckpointNotFoundError: no manifest)."""
    metadata = pool.submit(read_or_none, records, raw_metadata, step)
    return fmt.read_manifest(records, step), metadata.result()


def _newest_local(pool: ThreadPoolExecutor, records: Storage) -> tuple[int, Manifest | CkptError, bytes | None] | None:
    """Rank 0: the newest local-level step with a manifest, read with its ``.metadata`` at once — the listing, then
    one round trip, where looking the manifest up first took another, behind every rank's restart traffic. A
    directory without a manifest is a save in flight, passed; an unreadable manifest is returned as its error."""
    for step in reversed(fmt.all_step_dirs(records)):
        try:
            manifest, metadata = _read_local(pool, records, step)
        except CheckpointNotFoundError:
            continue
        except CorruptCheckpointError as exc:
            return step, exc, None
        return step, manifest, metadata
    return None


def _decide(durable: Storage, records: Storage, step: int | None, world_size: int) -> _Decision:
    """Rank 0: the durable candidate, the local candidate (or None) and why a local one was set aside."""
    with ThreadPoolExecutor(4, thread_name_prefix="ckptio-choice") as pool:
        if step is not None:
            candidate, local_step = _given_step(pool, durable, records, step)
            if local_step is None:
                return _Decision(candidate, None)
            # The same step on the durable level (is it the same save?), read beside the local records.
            twin = pool.submit(fmt.read_manifest, durable, step) if candidate == step else None
            try:
                found: Manifest | CkptError
                found, metadata = _read_local(pool, records, local_step)
            except (CorruptCheckpointError, CheckpointNotFoundError) as exc:
                found, metadata = exc, None
        else:
            newest_durable = pool.submit(choose_durable, durable, None)
            newest_local = _newest_local(pool, records)
            newest = newest_durable.result()
            candidate = newest.step if newest is not None else None
            if newest_local is None or (candidate is not None and newest_local[0] < candidate):
                return _Decision(candidate, None)
            local_step, found, metadata = newest_local
            twin = pool.submit(fmt.read_manifest, durable, local_step) if candidate == local_step else None
        return _local_decision(candidate, found, metadata, world_size, twin)


def _local_decision(candidate: int | None, local: Manifest | CkptError, metadata: bytes | None, world_size: int,
                    twin: Future[Manifest] | None) -> _Decision:
    """The decision once the local candidate's manifest is read (or failed to be); ``twin``: the durable level's
    manifest of the same step, when it has one (the same save: a file lost on every node is read there)."""
    if isinstance(local, CkptError):
        return _Decision(candidate, None, note=f"local level unreadable ({local})")
    if local.world_size != world_size:
        return _Decision(candidate, None, note=f"local-level step {local.step} was saved by {local.world_size} "
                                                f"ranks, this job has {world_size}: restoring from the durable level")
    try:
        fallback = twin is not None and twin.result().save_id == local.save_id
    except (CorruptCheckpointError, CheckpointNotFoundError):
        fallback = False
    return _Decision(candidate, local, durable_fallback=fallback, metadata=metadata)


def _chosen(choosing: Future[_Decision] | None) -> _Decision:
    """Rank 0's decision, once its lookups end (only rank 0 submits them, and only rank 0 asks)."""
    assert choosing is not None
    return choosing.result()


class TwoLevelRestore:
    """One ``restore`` of a two-level job (every rank together), from ``ctx``'s durable root and local level."""

    def __init__(self, ctx: RestoreContext) -> None:
        assert ctx.level is not None and ctx.local is not None
        self.ctx, self.level, self.local, self.group = ctx, ctx.level, ctx.local, ctx.group
        self.durable, self.records = ctx.durable, ctx.level.records

    def run(self, state: dict[str, Any], step: int | None) -> RestoreReport:
        """The newest restorable step, from the fastest intact copies. Rank 0's lookups on the store run while
        every node reports its holdings and a lost node's files are pushed back to it (:mod:`early_push`)."""
        t0 = time.monotonic()
        group = self.group
        with ThreadPoolExecutor(1, thread_name_prefix="ckptio-choice") as chooser:
            choosing = (chooser.submit(_decide, self.durable, self.records, step, group.world_size)
                        if group.rank == 0 else None)
            early = EarlyPush.begin(self.ctx)
            try:
                decision = rank0_choice(group, lambda: _chosen(choosing))
                return self._restore(state, step, decision, early, t0)
            finally:
                early.finish()

    def _restore(self, state: dict[str, Any], step: int | None, decision: _Decision, early: EarlyPush,
                 t0: float) -> RestoreReport:
        local, note = decision.local, decision.note
        if local is not None:
            held = early.held(local)
            missing = [n for n, nodes in held.nodes.items() if not nodes]
            if missing and not decision.durable_fallback:
                note = (f"local-level step {local.step}: {len(missing)} file(s) held on no node (e.g. {missing[0]}): "
                        "restoring from the durable level")
            else:
                sources = self._load_local(state, local, held, decision, early)
                if sources is not None:
                    return self._report(local.step, "local", dict(sources), note, t0)
                note = (f"local-level step {local.step}: a copy failed its checks on every source: restoring from "
                        "the durable level")
        if decision.durable is None:
            if note is not None:
                raise CheckpointNotFoundError(f"no restorable step: {note}, and the durable level has none",
                                              root=self.durable.url, step=local.step if local else step)
            return self._report(None, "none", {}, None, t0)
        restored = restore_step(self.ctx, state, step=decision.durable)
        return self._report(restored.step, restored.level, {}, note or restored.note, t0)

    def _load_local(self, state: dict[str, Any], local: Manifest, held: Held, decision: _Decision,
                    early: EarlyPush) -> Counter[str] | None:
        """Load ``local`` into ``state``; None (on every rank) when any rank could not read it. A state that does
        not match raises on every rank: no other copy would match better."""
        reader = LevelsStorageReader(self.ctx, local, held=held.nodes, durable_fallback=decision.durable_fallback)
        reader.given_metadata(decision.metadata)
        reader.given_pushes(early.pushed_to(local.step), early.landings(local.step))
        checking = reader.check_partner_copies(set(local.files) - held.owned)
        try:
            return self._load_through(state, local, reader)
        finally:
            if checking is not None:
                checking.join()

    def _load_through(self, state: dict[str, Any], local: Manifest,
                      reader: LevelsStorageReader) -> Counter[str] | None:
        group = self.group
        error: BaseException | None = None
        try:
            reader.read_metadata()
        except Exception as exc:  # reported at the gate: every rank falls back together
            error = exc
        failures = gather_ready(group, error, timeout_s=self.ctx.options.ready_timeout_s, step=local.step)
        if failures:
            log.warning("ckptio: local-level step %s: metadata unusable on rank %s: %s", local.step,
                        failures[0].rank, failures[0].message)
            return None
        try:
            load_through(reader, state, process_group=self.ctx.process_group, step=local.step)
        except PeerLostError:
            raise  # no collective can agree with a rank that is gone; no other copy would bring it back
        except CkptError as exc:
            error = exc
        mismatch, failed = group.any_of([isinstance(error, StructureMismatchError), error is not None])
        if mismatch:
            raise error if isinstance(error, StructureMismatchError) else StructureMismatchError(
                "the state of another rank does not match the checkpoint", step=local.step)
        if failed:
            log.warning("ckptio: local-level step %s could not be read: %s", local.step, error)
            return None
        return reader.sources

    def _report(self, step: int | None, level: str, sources: dict[str, int], note: str | None,
                t0: float) -> RestoreReport:
        if note:
            log.warning("ckptio: %s", note)
        return RestoreReport(step=step, level=level, sources=sources, note=note, seconds=time.monotonic() - t0)
