"""Restore: pick the step every rank will load, then let DCP's load planner (resharding included) read it through
ckptio's StorageReader (:mod:`ckptio.engine.restore.storage_reader`): ranged reads into the targets, checksums on every
block, each range read from the store by one rank and sent to the others that need it, an intact local copy preferred.

Runs on the training thread; its only collectives are the step broadcast and those inside ``dcp.load`` (planning,
and the reader's exchange of ranges), all on ckptio's side group. It runs no code from the store unless
``trust_pickles`` says so (docs/security.md): the reader unpickles ``.metadata`` and values with allowlists.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckptio import format as fmt
from ckptio.engine.restore.storage_reader import CkptioStorageReader
from ckptio.engine.side_group import SideGroup
from ckptio.errors import CheckpointNotFoundError, CkptError, StructureMismatchError
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


def _choose_step(storage: Storage, step: int | None, group: SideGroup) -> int | CkptError | None:
    if group.rank != 0:
        return None
    if step is None:
        steps = fmt.committed_steps(storage)
        return steps[-1] if steps else None
    if not storage.exists(fmt.manifest_key(step)):
        return CheckpointNotFoundError("no committed checkpoint for this step", root=storage.url, step=step)
    return step


def unwrap_load_error(exc: CheckpointException, step: int) -> CkptError:
    """DCP wraps every rank's failure; surface ckptio's own error, or name a structure mismatch."""
    inners = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
    for inner in inners:
        if isinstance(inner, CkptError):
            return inner
    detail = "; ".join(sorted({f"{type(i).__name__}: {i}" for i in inners})) or repr(exc)
    return StructureMismatchError(f"state does not match the checkpoint: {detail}", step=step)


def restore_step(
    storage: Storage,
    state: dict[str, Any],
    *,
    step: int | None = None,
    local: Storage | None = None,
    group: SideGroup | None = None,
    concurrency: int = 4,
    trust_pickles: bool = False,
    safe_globals: Sequence[Any] = (),
) -> int | None:
    group = group or SideGroup()
    chosen = group.broadcast_from_rank0(_choose_step(storage, step, group))
    if isinstance(chosen, CkptError):
        raise chosen
    if chosen is None:
        return None
    reader = CkptioStorageReader(storage, chosen, local=local, concurrency=concurrency,
                                 trust_pickles=trust_pickles, safe_globals=safe_globals,
                                 process_group=group.group if group.distributed else None)
    reader.read_metadata()  # UntrustedCheckpointError, ChecksumError … raised here, not wrapped by DCP
    try:
        with warnings.catch_warnings():
            # One process without a process group is a supported mode here, not a mistake worth a warning.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(state, storage_reader=reader, process_group=group.group if group.distributed else None)
    except CheckpointException as exc:
        raise unwrap_load_error(exc, chosen) from exc
    except CkptError:
        raise
    except (RuntimeError, KeyError, ValueError, AssertionError) as exc:
        raise StructureMismatchError(f"state does not match the checkpoint: {exc}", step=chosen) from exc
    return int(chosen)
