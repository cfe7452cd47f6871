"""Which write item goes to which data file, and where each tensor sits in the staging slot.

A rank's final DCP save plan is a list of write items (tensors or chunks of them, and pickled objects). The layout
packs them into a few large files ``__{rank}_{n}-{save}.distcp``: items are taken in plan order and a new file
starts when the next item would push the current one past ``file_size_bytes`` (small tensors are thereby
coalesced; an item larger than the cap gets a file of its own). Pickled objects go to the first file.

This module is pure arithmetic: it never touches tensors, storage or processes, so the trainer computes the layout
once per state structure and the writer receives it as plain data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a plan is made, never where a layout is only read (the writer)
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import WriteItem

# Slot offsets are aligned so every staged tensor starts on a cache line (and on a CUDA-friendly boundary).
ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def data_file_name(rank: int, n: int, save_id: int) -> str:
    """DCP's naming for data files (``__{rank}_{n}``) plus the save attempt, so that two attempts at one step (a
    crashed run's leftovers, or a second job racing this one) never overwrite each other's bytes: whichever
    manifest wins, the files it lists are exactly the ones its checksums describe."""
    return f"__{rank}_{n}-{save_id:013x}.distcp"


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor write item: its DCP index, dtype, shape and place in the slot and in the files."""

    fqn: str
    chunk_offset: tuple[int, ...]
    index_hint: int | None
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    slot_offset: int
    file_no: int

    @property
    def index(self) -> MetadataIndex:
        from torch.distributed.checkpoint.metadata import MetadataIndex

        return MetadataIndex(self.fqn, self.chunk_offset, self.index_hint)


@dataclass(frozen=True, slots=True)
class ObjectEntry:
    """One pickled-object write item (always in file 0)."""

    fqn: str
    index_hint: int | None
    file_no: int = 0

    @property
    def index(self) -> MetadataIndex:
        from torch.distributed.checkpoint.metadata import MetadataIndex

        return MetadataIndex(self.fqn, None, self.index_hint)


@dataclass(frozen=True, slots=True)
class RankLayout:
    """The complete layout of one rank's share of a checkpoint."""

    rank: int
    tensors: tuple[TensorEntry, ...]
    objects: tuple[ObjectEntry, ...]
    slot_bytes: int
    n_files: int

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _dtype_name(item: WriteItem) -> str:
    assert item.tensor_data is not None
    return str(item.tensor_data.properties.dtype).removeprefix("torch.")


def plan_layout(rank: int, items: list[WriteItem], file_size_bytes: int) -> RankLayout:
    """Pack ``items`` (a final local save plan) into files and slot offsets."""
    import torch
    from torch.distributed.checkpoint.planner import WriteItemType

    tensors: list[TensorEntry] = []
    objects: list[ObjectEntry] = []
    slot_offset = 0
    file_no, file_fill = 0, 0
    for item in items:
        if item.type == WriteItemType.BYTE_IO:
            objects.append(ObjectEntry(fqn=item.index.fqn, index_hint=item.index.index))
            continue
        assert item.tensor_data is not None
        # The chunk (this rank's shard of a DTensor, or the whole tensor) is what gets staged and written.
        shape = tuple(item.tensor_data.chunk.sizes)
        nbytes = math.prod(shape) * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()
        if file_fill and file_fill + nbytes > file_size_bytes:
            file_no, file_fill = file_no + 1, 0
        tensors.append(
            TensorEntry(
                fqn=item.index.fqn,
                chunk_offset=tuple(item.index.offset or ()),
                index_hint=item.index.index,
                dtype=_dtype_name(item),
                shape=shape,
                nbytes=nbytes,
                slot_offset=slot_offset,
                file_no=file_no,
            )
        )
        file_fill += nbytes
        slot_offset = _align(slot_offset + nbytes)
    n_files = file_no + 1 if tensors else (1 if objects else 0)
    return RankLayout(
        rank=rank, tensors=tuple(tensors), objects=tuple(objects), slot_bytes=slot_offset, n_files=n_files
    )
