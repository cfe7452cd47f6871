"""Where a restore's bytes land on this rank: one destination per DCP read item, chosen by what the target allows.

* **Direct** — raw tensor bytes (the writer recorded where they start), a sub-box that is one run of the stored
  chunk's C-order bytes, and a contiguous CPU target of the same dtype: the bytes are read (or received) straight
  into the target's memory. No copy, no ``torch.load``.
* **Streamed** — the same, but the target has another dtype or lives on a GPU: each range is copied into its slice
  of the target as it arrives (a cast, or a non-blocking host-to-device copy from a pinned buffer on a side stream).
* **Assembled** — everything else: a strided sub-box or a non-contiguous target (the range is gathered, then viewed
  with the chunk's strides and copied), and items without known raw bytes (objects, files written before block
  checksums), which are gathered whole and loaded as today: tensors with ``torch.load(weights_only=True)``,
  objects with the allowlisted unpickler. Gathering costs the item's bytes in memory until it is complete.

Destinations never see bytes that failed a checksum: the transfer layer verifies each block before delivering it.
"""

from __future__ import annotations

import ctypes
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from ckptio.engine.restore.read_plan import ChunkShape, Place, contiguous_strides, need_range, sub_box_is_contiguous
from ckptio.errors import StructureMismatchError


def tensor_bytes(tensor: torch.Tensor, nbytes: int) -> memoryview:
    """The first ``nbytes`` of a contiguous CPU tensor's memory, writable, without a copy (any dtype)."""
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


class Dest:
    """The bytes one read item needs, ``[lo, hi)`` of ``file``, and what to do with them."""

    direct = False

    def __init__(self, req: ReadItem, file: str, lo: int, hi: int) -> None:
        self.req, self.file, self.lo, self.hi = req, file, lo, hi
        self.remaining = hi - lo
        self.deferred = False
        """True when the last copies may still run on a side stream: commit after the stream is synchronized."""

    def view(self, offset: int, length: int) -> memoryview | None:
        """Where ``[offset, offset + length)`` of the file can be read to directly, or None."""
        return None

    def accept(self, offset: int, data: memoryview) -> list[Any]:
        """Take the needed part of ``data`` (file bytes from ``offset``); returns events to wait for before the
        buffer is reused (side-stream copies)."""
        raise NotImplementedError

    def finish(self, planner: LoadPlanner) -> None:
        """All bytes are in: load, copy, commit."""
        raise NotImplementedError

    def _overlap(self, offset: int, data: memoryview) -> tuple[int, int]:
        return max(offset, self.lo), min(offset + data.nbytes, self.hi)


class _Tensor(Dest):
    def __init__(self, req: ReadItem, file: str, lo: int, hi: int, *, target: torch.Tensor, shape: ChunkShape,
                 stream: Any = None) -> None:
        super().__init__(req, file, lo, hi)
        self.target, self.shape, self.stream = target, shape, stream

    def finish(self, planner: LoadPlanner) -> None:
        planner.commit_tensor(self.req, self.target)


class DirectDest(_Tensor):
    direct = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memory = tensor_bytes(self.target, self.hi - self.lo)

    def view(self, offset: int, length: int) -> memoryview | None:
        if self.lo <= offset and offset + length <= self.hi:
            return self.memory[offset - self.lo : offset - self.lo + length]
        return None

    def accept(self, offset: int, data: memoryview) -> list[Any]:
        lo, hi = self._overlap(offset, data)
        self.memory[lo - self.lo : hi - self.lo] = data[lo - offset : hi - offset]
        return []


class StreamDest(_Tensor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flat = self.target.view(-1)
        self.deferred = self.target.device.type != "cpu"

    def accept(self, offset: int, data: memoryview) -> list[Any]:
        lo, hi = self._overlap(offset, data)
        size = self.shape.itemsize
        src = torch.frombuffer(data[lo - offset : hi - offset], dtype=self.shape.dtype)
        dst = self.flat[(lo - self.lo) // size : (hi - self.lo) // size]
        if self.stream is None:
            dst.copy_(src)
            return []
        with torch.cuda.stream(self.stream):  # pinned source: the copy overlaps the next reads
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return [event]


class _Gathered(Dest):
    """Gathers ``[lo, hi)`` into host memory, then ``load`` it."""

    def __init__(self, req: ReadItem, file: str, lo: int, hi: int, load: Callable[[bytearray], None]) -> None:
        super().__init__(req, file, lo, hi)
        self.buffer = bytearray(hi - lo)
        self.load = load

    def accept(self, offset: int, data: memoryview) -> list[Any]:
        lo, hi = self._overlap(offset, data)
        memoryview(self.buffer)[lo - self.lo : hi - self.lo] = data[lo - offset : hi - offset]
        return []

    def finish(self, planner: LoadPlanner) -> None:
        self.load(self.buffer)
        self.buffer = bytearray()


@dataclass(frozen=True, slots=True)
class DestHooks:
    """What a destination needs from its reader besides the item: the step (for errors), how stored bytes become
    a ``torch.save`` blob (DCP stream extensions undone, plain DCP's zip CRC-32 checked), how an object is loaded
    (the allowlisted unpickler), and the side stream of a GPU target."""

    step: int | None
    open_blob: Callable[[ReadItem, memoryview], bytes | memoryview]
    load_object: Callable[[ReadItem, bytes | memoryview], None]
    stream_for: Callable[[torch.Tensor], Any]


def make_dest(req: ReadItem, place: Place, shape: ChunkShape | None, planner: LoadPlanner, hooks: DestHooks) -> Dest:
    """The destination of ``req`` on this rank (resolving its target tensor once, as DCP does)."""
    lo, hi = need_range(place, req.storage_offsets, req.lengths, shape)
    step = hooks.step
    if req.type == LoadItemType.BYTE_IO:
        return _Gathered(req, place.file, lo, hi,
                         lambda buf: hooks.load_object(req, hooks.open_blob(req, memoryview(buf))))
    target = planner.resolve_tensor(req).detach()
    if target.size() != torch.Size(req.lengths):
        raise StructureMismatchError(f"{req.storage_index.fqn!r}: checkpoint has shape {tuple(req.lengths)}, target "
                                     f"has {tuple(target.size())}", step=step, path=req.storage_index.fqn)
    if place.raw_offset is None or shape is None:
        def load_blob(buf: bytearray) -> None:
            blob = hooks.open_blob(req, memoryview(buf))
            tensor = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            _check_shape(req, tensor, target, step)
            target.copy_(tensor)
            planner.commit_tensor(req, target)
        return _Gathered(req, place.file, lo, hi, load_blob)
    if sub_box_is_contiguous(shape.sizes, req.storage_offsets, req.lengths) and target.is_contiguous():
        if target.device.type == "cpu" and target.dtype == shape.dtype:
            return DirectDest(req, place.file, lo, hi, target=target, shape=shape)
        return StreamDest(req, place.file, lo, hi, target=target, shape=shape, stream=hooks.stream_for(target))

    def load_strided(buf: bytearray) -> None:
        if buf:
            flat = torch.frombuffer(buf, dtype=shape.dtype)
            target.copy_(flat.as_strided(tuple(req.lengths), contiguous_strides(shape.sizes), 0))
        planner.commit_tensor(req, target)
    return _Gathered(req, place.file, lo, hi, load_strided)


def _check_shape(req: ReadItem, tensor: torch.Tensor, target: torch.Tensor, step: int | None) -> None:
    if target.size() != tensor.size():
        raise StructureMismatchError(f"{req.storage_index.fqn!r}: checkpoint has shape {tuple(tensor.size())}, "
                                     f"target has {tuple(target.size())}", step=step, path=req.storage_index.fqn)
