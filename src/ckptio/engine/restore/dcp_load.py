"""The one call of ``torch.distributed.checkpoint.load`` in ckptio's restore, and how its failures become ckptio's.

DCP wraps a failure of any rank in its planning or reading into a ``CheckpointException`` raised on every rank;
a state that does not match the checkpoint surfaces as a ``RuntimeError``, ``KeyError``, ``ValueError`` or
``AssertionError`` from DCP's planner. The caller sees ckptio's own error either way: the ``CkptError`` a rank
raised (a checksum, an untrusted pickle, a missing file), else :class:`~ckptio.errors.StructureMismatchError`
naming what DCP said. Every restore path (one level, the local level of two) loads through :func:`load_through`,
so the mapping is written once.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.storage import StorageReader

from ckptio.errors import CkptError, StructureMismatchError


def unwrap_load_error(exc: CheckpointException, step: int) -> CkptError:
    """DCP wraps every rank's failure; surface ckptio's own error, or name a structure mismatch."""
    inners = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
    for inner in inners:
        if isinstance(inner, CkptError):
            return inner
    detail = "; ".join(sorted({f"{type(i).__name__}: {i}" for i in inners})) or repr(exc)
    return StructureMismatchError(f"state does not match the checkpoint: {detail}", step=step)


def load_through(reader: StorageReader, state: dict[str, Any], *, process_group: Any, step: int) -> None:
    """``dcp.load`` of ``state`` through ``reader`` on ``process_group`` (every rank together); raises only
    ``CkptError``s, as the module docstring says."""
    try:
        with warnings.catch_warnings():
            # One process without a process group is a supported mode here, not a mistake worth a warning.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(state, storage_reader=reader, process_group=process_group)
    except CheckpointException as exc:  # DCP raises a rank's failure on every rank (a BaseException)
        raise unwrap_load_error(exc, step) from exc
    except CkptError:
        raise
    except (RuntimeError, KeyError, ValueError, AssertionError) as exc:
        raise StructureMismatchError(f"state does not match the checkpoint: {exc}", step=step) from exc
