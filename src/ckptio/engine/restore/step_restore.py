"""Restore: pick the step every rank will load, then let DCP's load planner (resharding included) read it through
ckptio's StorageReader (:mod:`ckptio.engine.restore.storage_reader`): ranged reads into the targets, checksums on every
block, each range read from the store by one rank and sent to the others that need it, an intact local copy preferred.

Runs on the training thread; its only collectives are the step broadcast, the readiness gate
(:mod:`ckptio.engine.restore.readiness`) and those inside ``dcp.load`` (planning, and the reader's exchange of
ranges), all on ckptio's side group. It runs no code from the store unless
``trust_pickles`` says so (docs/security.md): the reader unpickles ``.metadata`` and values with allowlists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptio import format as fmt
from ckptio.engine.restore.context import RestoreContext
from ckptio.engine.restore.dcp_load import load_through
from ckptio.engine.restore.readiness import check_ready, rank0_choice
from ckptio.engine.restore.storage_reader import CkptioStorageReader
from ckptio.errors import CheckpointNotFoundError
from ckptio.storage.base import Storage


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a ``restore`` read: the step (None: nothing to restore), the level it came from, and per source
    (``local``, ``partner``, ``durable``) how many files it read there; ``note`` says why a newer step or a faster
    level was set aside."""

    step: int | None
    level: str
    """``durable``, ``local`` or ``none``."""
    sources: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    seconds: float = 0.0


def _choose_step(storage: Storage, step: int | None) -> int | None:
    """Rank 0: the newest committed step, or ``step`` once its manifest is there."""
    if step is None:
        steps = fmt.committed_steps(storage)
        return steps[-1] if steps else None
    if not storage.exists(fmt.manifest_key(step)):
        raise CheckpointNotFoundError("no committed checkpoint for this step", root=storage.url, step=step)
    return step


def restore_step(ctx: RestoreContext, state: dict[str, Any], *, step: int | None = None) -> int | None:
    """Load the newest committed step of ``ctx.durable`` (or ``step``) into ``state``, every rank of ``ctx.group``
    together; the step loaded, or None when the root has none.

    Rank 0 chooses and broadcasts the step (what stops it there is broadcast too, since the others wait for it);
    then every rank reads the step's records, and a rank that cannot fails every rank at the readiness gate
    (:mod:`ckptio.engine.restore.readiness`), before DCP's planning."""
    group = ctx.group
    chosen = rank0_choice(group, lambda: _choose_step(ctx.durable, step))
    if chosen is None:
        return None
    reader, error = None, None
    try:
        reader = CkptioStorageReader.in_context(ctx, chosen, fmt.read_manifest(ctx.durable, chosen))
        reader.read_metadata()  # UntrustedCheckpointError, ChecksumError … raised at the gate, not wrapped by DCP
    except Exception as exc:  # reported to every rank at the gate, then raised here as it is
        error = exc
    check_ready(group, error, timeout_s=ctx.options.ready_timeout_s, step=chosen)
    assert reader is not None
    load_through(reader, state, process_group=ctx.process_group, step=chosen)
    return int(chosen)
