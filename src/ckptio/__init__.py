"""ckptio: keep checkpoint I/O bursts off the training critical path.

The public API::

    ck = ckptio.Checkpointer(root=..., local_dir=None, max_pending=1, overflow="block", keep_last=3)
    h = ck.save(step, state); h.skipped; h.done(); h.wait()
    ck.maybe_save(step, state); ck.wait(); ck.restore(state, step=None); ck.latest_step(); ck.close()
"""

from __future__ import annotations

from ckptio import errors
from ckptio.checkpointer import Checkpointer, SaveHandle
from ckptio.config import CheckpointerConfig
from ckptio.dcp import CkptioStorageReader
from ckptio.storage import open_storage

__version__ = "0.1.0"

__all__ = [
    "Checkpointer",
    "CheckpointerConfig",
    "CkptioStorageReader",
    "SaveHandle",
    "__version__",
    "errors",
    "open_storage",
]
