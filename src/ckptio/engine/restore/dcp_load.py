"""The one call of ``torch.distributed.checkpoint.load`` in ckptio's restore, and how its failures become ckptio's.

DCP wraps a failure of any rank in its planning or reading into a ``CheckpointException`` raised on every rank;
a state that does not match the checkpoint surfaces as a ``RuntimeError``, ``KeyError``, ``ValueError`` or
``AssertionError`` from DCP's planner. The caller sees ckptio's own error either way: the ``CkptError`` a rank
raised (a checksum, an untrusted pickle, a missing file), else :class:`~ckptio.errors.StructureMismatchError`
naming what DCP said. A rank that is gone is :class:`~ckptio.errors.PeerLostError`: the one the reader's exchange
found (DCP's gather of the outcome, which would have carried it, fails on the dead rank's connection), or, for a
loss inside DCP's own collectives, the gloo transport error that says so (phase ``load``, rank unknown). Every
restore path (one level, the local level of two) loads through :func:`load_through`, so the mapping is written once.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckptio.engine.restore.storage_reader import CkptioStorageReader
from ckptio.errors import ChecksumError, CkptError, PeerLostError, StructureMismatchError

# How gloo's TCP transport reports a peer whose process is gone (its sockets closed by the kernel).
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|gloo/transport/tcp")


def unwrap_load_error(exc: CheckpointException, step: int) -> CkptError:
    """DCP wraps every rank's failure; surface ckptio's own error, or name a structure mismatch. Bytes that failed
    their checks where they were received (a ChecksumError naming the rank that sent them) are a consequence when
    that rank failed too: its reader sends whatever it has so no peer waits, and its own failure is the cause."""
    failures = {rank: f[0] if isinstance(f, tuple) else f for rank, f in exc.failures.items()}
    inners = list(failures.values())
    for rank, inner in failures.items():
        if isinstance(inner, CkptError):
            sender = inner.rank if isinstance(inner, ChecksumError) and inner.rank != rank else None
            cause = failures.get(sender) if sender is not None else None
            return cause if isinstance(cause, CkptError) else inner
    detail = "; ".join(sorted({f"{type(i).__name__}: {i}" for i in inners})) or repr(exc)
    return StructureMismatchError(f"state does not match the checkpoint: {detail}", step=step)


def load_through(reader: CkptioStorageReader, state: dict[str, Any], *, process_group: Any, step: int) -> None:
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
        if isinstance(reader.failure, PeerLostError):
            raise reader.failure from exc
        if isinstance(exc, RuntimeError) and _PEER_GONE.search(str(exc)):
            raise PeerLostError(f"a rank was lost in DCP's collectives: {exc}", step=step, phase="load") from exc
        raise StructureMismatchError(f"state does not match the checkpoint: {exc}", step=step) from exc
