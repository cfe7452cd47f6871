"""The demo's emulated shared store: one bandwidth budget that ckptio and the DCP baselines must share.

ckptio writes through :class:`~ckptio.testing.wrappers.ThrottledStorage`; the DCP baselines write through
:class:`ThrottledFileSystemWriter`, which books its bytes on the same state file with the same semantics
(reserve a slot on the shared virtual clock, write for real, sleep out the remainder). So all four modes
face exactly the same emulated filesystem, and concurrent ranks split its bandwidth like clients of a
saturated filesystem do.

This module must never decide policy (when to save, what to keep): it only builds stores and writers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptio.errors import ConfigError
from ckptio.storage import PosixStorage, Storage
from ckptio.testing.wrappers import ThrottledStorage


@dataclass(kw_only=True, slots=True)
class ThrottleSpec:
    """One emulated store's write budget, shared by every process that books on ``state_path``."""

    bytes_per_s: float
    """Aggregate write bandwidth of the emulated store."""

    state_path: str
    """The shared virtual-clock file (created empty if missing)."""

    def __post_init__(self) -> None:
        if self.bytes_per_s <= 0:
            raise ConfigError(f"bandwidth must be positive, got {self.bytes_per_s}")
        os.makedirs(os.path.dirname(os.path.abspath(self.state_path)), exist_ok=True)
        if not os.path.exists(self.state_path):
            with open(self.state_path, "wb"):
                pass

    def wrap(self, inner: Storage) -> ThrottledStorage:
        """``inner`` behind this budget (what ckptio writes to)."""
        return ThrottledStorage(inner, write_bytes_per_s=self.bytes_per_s, state_path=self.state_path)

    def posix(self, directory: str, *, fsync: bool = True) -> ThrottledStorage:
        return self.wrap(PosixStorage(directory, fsync=fsync))


def _planned_bytes(plan: SavePlan, planner: SavePlanner) -> int:
    """Bytes this rank's plan writes: tensor chunks by shape and dtype, small byte items by resolving them."""
    total = 0
    for item in plan.items:
        if item.type == WriteItemType.BYTE_IO:
            data = planner.resolve_data(item)
            total += len(data.getbuffer()) if hasattr(data, "getbuffer") else 0
            continue
        assert item.tensor_data is not None
        numel = 1
        for size in item.tensor_data.chunk.sizes:
            numel *= size
        total += numel * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()
    return total


class ThrottledFileSystemWriter(FileSystemWriter):
    """DCP's plain file-system writer, paced by a :class:`ThrottleSpec` just like ``ThrottledStorage.put``."""

    def __init__(self, path: str, *, throttle: ThrottleSpec, **options: Any) -> None:
        super().__init__(path, **options)
        # The pacing reuses ThrottledStorage's clock so both kinds of writer book on one budget with one rule.
        self._clock = throttle.wrap(PosixStorage(path, fsync=False))

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        end = self._clock.book(_planned_bytes(plan, planner), self._clock.write_bytes_per_s)
        results = super().write_data(plan, planner).wait()
        self._clock.wait_until(end)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done
