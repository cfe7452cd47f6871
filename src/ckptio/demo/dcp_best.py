"""DCP-best: torch's strongest async checkpoint path, the peer every ckptio figure is measured against, written once.

The configuration is the one its documentation gives (bench/README.md states it too): ``dcp.async_save`` with a
PROCESS checkpointer (the write runs in a separate process) and a ``DefaultStager`` staging asynchronously into cached
shared memory, with pinned memory and non-blocking copies when the state is on an accelerator (both assert without
one). Its discipline is part of the configuration: the caller waits on ``staging_completion`` before the state
changes (:meth:`DcpBest.wait_staged`, before ``optimizer.step``) and on the previous ``upload_completion`` before the
next save (:meth:`DcpBest.save` does: DCP reuses its staging buffers). The demo's saver and every benchmark use this
class, so a figure against "DCP-best" always means the same peer. It owns no events and no timing: callers measure.
"""

from __future__ import annotations

import time
from typing import Any


class DcpBest:
    """One rank's DCP-best saver. ``process_group``: the group its saves coordinate on (a gloo group of its own when
    training uses gloo; None: the default group). ``accelerator``: the state lives on a GPU, so pinned staging memory
    and non-blocking copies are on. The first save spawns DCP's checkpoint process (a fresh interpreter that imports
    torch; the caller's script needs a main guard); :meth:`close` after the last save."""

    def __init__(self, *, process_group: Any = None, accelerator: bool = False) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.process_group = process_group
        self.stager = DefaultStager(StagingOptions(use_pinned_memory=accelerator, use_shared_memory=True,
                                                   use_async_staging=True, use_non_blocking_copy=accelerator))
        self.staging: Any = None
        """``staging_completion`` of the last save until :meth:`wait_staged` has waited on it."""
        self.upload: Any = None
        """``upload_completion`` of the last save until :meth:`wait` has waited on it."""

    def save(self, state: dict[str, Any], storage_writer: Any) -> Any:
        """Start one save of ``state`` through ``storage_writer`` (a ``FileSystemWriter`` or one derived from it), once
        the previous save is durable; returns DCP's ``AsyncSaveResponse``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.wait()
        response: Any = dcp.async_save(state, storage_writer=storage_writer, process_group=self.process_group,
                                       async_checkpointer_type=AsyncCheckpointerType.PROCESS, async_stager=self.stager)
        self.staging, self.upload = response.staging_completion, response.upload_completion
        return response

    def wait_staged(self) -> float:
        """Wait until the last save no longer reads the live state; returns the seconds waited."""
        if self.staging is None:
            return 0.0
        began = time.perf_counter()
        staging, self.staging = self.staging, None
        staging.result()
        return time.perf_counter() - began

    def done(self) -> bool:
        """The last save is durable (or failed: :meth:`wait` raises its error)."""
        return self.upload is None or bool(self.upload.done())

    def wait(self) -> None:
        """Wait until the last save is durable; raises its error if it failed."""
        self.wait_staged()
        if self.upload is not None:
            upload, self.upload = self.upload, None
            upload.result()

    def close(self) -> None:
        """Wait for the last save, then release the stager's threads and shared memory."""
        self.wait()
        self.stager.close()
