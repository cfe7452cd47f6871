"""ckptio: keep checkpoint I/O bursts off the training critical path.

The public API::

    ck = ckptio.Checkpointer(root=..., local_dir=None, max_pending=1, overflow="block", keep_last=3)
    h = ck.save(step, state); h.skipped; h.done(); h.wait()
    ck.maybe_save(step, state); ck.wait(); ck.restore(state, step=None); ck.latest_step(); ck.close()

Names are imported lazily: a process that only needs storage or the planner (probe workers, the CLI) does not pay
for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ckptio import errors
from ckptio._version import __version__

if TYPE_CHECKING:
    from ckptio.config import CheckpointerConfig
    from ckptio.engine.restore.storage_reader import CkptioStorageReader
    from ckptio.engine.trainer.checkpointer import Checkpointer
    from ckptio.engine.trainer.save_handle import SaveHandle
    from ckptio.policy.residency import Residency
    from ckptio.storage import open_storage

_LAZY = {
    "Checkpointer": "ckptio.engine.trainer.checkpointer",
    "SaveHandle": "ckptio.engine.trainer.save_handle",
    "CheckpointerConfig": "ckptio.config",
    "CkptioStorageReader": "ckptio.engine.restore.storage_reader",
    "Residency": "ckptio.policy.residency",
    "open_storage": "ckptio.storage",
}

__all__ = [
    "Checkpointer",
    "CheckpointerConfig",
    "CkptioStorageReader",
    "Residency",
    "SaveHandle",
    "__version__",
    "errors",
    "open_storage",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptio' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
