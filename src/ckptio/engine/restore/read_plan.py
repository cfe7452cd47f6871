"""Who reads which bytes of a checkpoint, and who receives them: the restore's read plan (pure arithmetic).

DCP's load planners decide which stored items (or parts of them) each rank needs. From those and the store's
layout this module derives the byte ranges each rank needs, cuts the checksum blocks those ranges touch into
*tasks* (a contiguous file range of at most ``chunk`` bytes, made of whole checksum blocks), and gives every task
exactly one reader; the task's other needers receive it from that reader over the side group. So each byte is read
from the store once, whatever the number of ranks that hold it (a replicated tensor, a reshard onto more ranks).

How a reader is chosen, task by task in file order: among the ranks that may read the file (any rank; with two
levels, the ranks on nodes that hold a copy), prefer ranks that need the task themselves; of those, the one with
the fewest bytes assigned so far. Reading stays spread evenly over the ranks that need the bytes, and no rank reads
what it would then only forward when a needer could read it itself.

A task never mixes checksum blocks of two large items (so a task of one tensor's bytes can land in that tensor's
memory), nor blocks that different sets of ranks need, and no rank's need starts or ends inside a task except at
its edges: within a task each needer takes either all of it or, for a block it needs only part of, a bounce copy.
A file whose rank index is missing or predates block checksums is one task of the whole file, checked with the
file's crc32c.

The same assignment prices a layout for the planner: :func:`read_shares` takes regions and their needers and
returns each rank's bytes read from the store, sent and received. Nothing here touches storage or processes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptio.format.blocks import Block, split_blocks
from ckptio.format.records import FileRecord, ItemRecord

CHUNK_BYTES = 16 << 20
"""Largest task (and bounce buffer): large enough for full-speed device and S3 requests, small enough that
``concurrency`` of them in flight stay a small fraction of host memory."""
PACK_BYTES = 1 << 20
"""Items whose checked bytes are at most this share tasks with their neighbours (small tensors, objects)."""
MAX_GAP = 64 << 10
"""Largest unchecked gap (torch.save framing between items) a packed task reads through."""


@dataclass(frozen=True, slots=True)
class Task:
    """One contiguous file range read by one rank and sent to the others that need it."""

    id: int
    file: str
    offset: int
    length: int
    blocks: tuple[Block, ...]
    reader: int
    receivers: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def gapless(self) -> bool:
        """True when the blocks cover the whole range (a task within one item's bytes)."""
        return sum(b.length for b in self.blocks) == self.length


@dataclass(frozen=True, slots=True)
class ChunkShape:
    """A stored chunk's shape and element size (from DCP's metadata)."""

    sizes: tuple[int, ...]
    itemsize: int
    dtype: Any

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * self.itemsize


@dataclass(frozen=True, slots=True)
class Place:
    """Where a stored item lies in its file and whether its raw tensor bytes can be addressed directly."""

    file: str
    offset: int
    length: int
    raw_offset: int | None = None
    """File offset of the raw tensor bytes (C order, ``ChunkShape``), or None: the item is loaded whole."""


@dataclass(frozen=True, slots=True)
class RankReads:
    """One rank's share of the plan: its tasks (as reader or receiver) in id order, and where its items lie."""

    tasks: tuple[Task, ...]
    places: dict[Any, Place]
    exchange: bool


@dataclass(slots=True)
class StoreLayout:
    """What the coordinator knows of the stored bytes: item places and blocks, and files checked whole."""

    places: dict[Any, Place] = field(default_factory=dict)
    blocks: dict[Any, list[Block]] = field(default_factory=dict)
    """Per item with block checksums: its blocks in file order."""
    whole_files: dict[str, FileRecord] = field(default_factory=dict)
    """Files without usable block checksums: read and checked whole."""


def item_blocks(rec: ItemRecord) -> list[Block]:
    start, nbytes = rec.checked_span()
    return split_blocks(rec.file_offset + start, nbytes, rec.block_size, rec.crc32c, rec.fqn)


def need_range(place: Place, storage_offsets: Sequence[int], lengths: Sequence[int],
               shape: ChunkShape | None) -> tuple[int, int]:
    """The file range a read item needs: the enclosing range of its sub-box in the raw bytes, else the item."""
    if place.raw_offset is None or shape is None:
        return place.offset, place.offset + place.length
    if any(n == 0 for n in lengths):
        return place.raw_offset, place.raw_offset
    strides = contiguous_strides(shape.sizes)
    first = sum(o * s for o, s in zip(storage_offsets, strides, strict=True))
    last = sum((o + n - 1) * s for o, n, s in zip(storage_offsets, lengths, strides, strict=True))
    return place.raw_offset + first * shape.itemsize, place.raw_offset + (last + 1) * shape.itemsize


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(sizes):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def sub_box_is_contiguous(sizes: Sequence[int], storage_offsets: Sequence[int], lengths: Sequence[int]) -> bool:
    """True when a sub-box's elements are one run of the chunk's C-order bytes."""
    dims = [i for i, (n, s) in enumerate(zip(lengths, sizes, strict=True)) if n != s]
    if not dims:
        return True
    k = dims[0]
    return all(lengths[i] == sizes[i] for i in range(k + 1, len(sizes))) and all(
        lengths[i] == 1 for i in range(k))


@dataclass(slots=True)
class _BlockNeed:
    block: Block
    item: Any
    small: bool
    needers: set[int] = field(default_factory=set)
    partial: set[int] = field(default_factory=set)


def _collect_needs(needs: Sequence[Iterable[tuple[Any, int, int]]],
                   layout: StoreLayout) -> tuple[list[_BlockNeed], dict[str, set[int]]]:
    """Per block, the ranks that need any of it (and those that need only part); per whole file, its needers."""
    per_item: dict[Any, list[_BlockNeed]] = {}
    whole: dict[str, set[int]] = {}
    for rank, rank_needs in enumerate(needs):
        for item, lo, hi in rank_needs:
            place = layout.places[item]
            if place.file in layout.whole_files:
                whole.setdefault(place.file, set()).add(rank)
                continue
            if lo >= hi:
                continue
            blocks = per_item.get(item)
            if blocks is None:
                found = layout.blocks[item]
                small = sum(b.length for b in found) <= PACK_BYTES
                blocks = per_item[item] = [_BlockNeed(b, item, small) for b in found]
            for need in blocks:
                b = need.block
                if b.offset < hi and lo < b.offset + b.length:
                    need.needers.add(rank)
                    if not (lo <= b.offset and b.offset + b.length <= hi):
                        need.partial.add(rank)
    flat = [n for blocks in per_item.values() for n in blocks if n.needers]
    flat.sort(key=lambda n: (layout.places[n.item].file, n.block.offset))
    return flat, whole


def _group(flat: list[_BlockNeed], files: Callable[[Any], str], chunk: int) -> list[list[_BlockNeed]]:
    groups: list[list[_BlockNeed]] = []
    for need in flat:
        if groups:
            last = groups[-1][-1]
            start = groups[-1][0].block.offset
            joins = (files(last.item) == files(need.item)
                     and (last.item == need.item or (last.small and need.small))
                     and need.block.offset - (last.block.offset + last.block.length) <= MAX_GAP
                     and need.block.offset + need.block.length - start <= chunk
                     and last.needers == need.needers and last.partial == need.partial)
            if joins:
                groups[-1].append(need)
                continue
        groups.append([need])
    return groups


@dataclass(slots=True)
class _Load:
    bytes: list[int]

    def pick(self, needers: Iterable[int], allowed: Sequence[int] | None) -> int:
        needers = sorted(needers)
        pool = [r for r in needers if allowed is None or r in allowed] or list(allowed or needers)
        return min(pool, key=lambda r: (self.bytes[r], r))


def plan_reads(needs: Sequence[Iterable[tuple[Any, int, int]]], layout: StoreLayout, *, exchange: bool,
               readers_of: Callable[[str], Sequence[int] | None] = lambda _: None,
               chunk: int = CHUNK_BYTES) -> list[RankReads]:
    """Every rank's :class:`RankReads` from what each needs (``needs[rank]``: (item, lo, hi) file ranges).

    ``exchange=False`` (no side group that moves CPU bytes) gives every needer its own tasks: no sharing.
    ``readers_of(file)`` names the ranks that may read a file (None: any).
    """
    world = len(needs)
    flat, whole = _collect_needs(needs, layout)
    entries: list[tuple[str, int, int, tuple[Block, ...], set[int]]] = []
    for name in sorted(whole):
        rec = layout.whole_files[name]
        entries.append((name, 0, rec.size, (Block(0, rec.size, rec.crc32c, name),), whole[name]))
    for group in _group(flat, lambda item: layout.places[item].file, chunk):
        first, last = group[0].block, group[-1].block
        entries.append((layout.places[group[0].item].file, first.offset, last.offset + last.length - first.offset,
                        tuple(n.block for n in group), group[0].needers))
    load = _Load([0] * world)
    tasks: list[Task] = []
    for name, offset, length, blocks, needers in entries:
        for owners in ([needers] if exchange else [{r} for r in sorted(needers)]):
            reader = load.pick(owners, readers_of(name) if exchange else None)
            load.bytes[reader] += length
            tasks.append(Task(id=len(tasks), file=name, offset=offset, length=length, blocks=blocks,
                              reader=reader, receivers=tuple(sorted(owners - {reader}))))
    mine: list[list[Task]] = [[] for _ in range(world)]
    for task in tasks:
        for rank in (task.reader, *task.receivers):
            mine[rank].append(task)
    return [RankReads(tasks=tuple(mine[r]), places={item: layout.places[item] for item, _, _ in needs[r]},
                      exchange=exchange) for r in range(world)]


@dataclass(frozen=True, slots=True)
class ReadShares:
    """Bytes per rank of one restore: read from the store, sent to other ranks, received from them."""

    read: list[int]
    sent: list[int]
    received: list[int]


def read_shares(regions: Sequence[tuple[int, frozenset[int]]], world_size: int, *, exchange: bool = True,
                chunk: int = CHUNK_BYTES, readers: Mapping[int, Sequence[int]] | None = None) -> ReadShares:
    """What :func:`plan_reads` costs each rank for a layout given as regions (bytes, ranks that need them), in
    order — the restore's model for the planner (:mod:`ckptio.plan.costs.readback`): time ≈ max over ranks of
    read ÷ store bandwidth, and of what the rank sends and receives ÷ the side group's bandwidth. ``readers[i]``
    limits who may read region ``i``.

    The reader of each ``chunk`` is :meth:`_Load.pick`'s (a needer among the allowed ranks, the least loaded, the
    lowest rank on a tie), kept in a heap so a region costs its chunks × log(its readers), not × its needers: the
    planner prices jobs of thousands of ranks with it."""
    load = _Load([0] * world_size)
    read, sent, received = [0] * world_size, [0] * world_size, [0] * world_size
    for i, (nbytes, needers) in enumerate(regions):
        if nbytes <= 0:
            continue
        if not exchange:
            for r in needers:
                load.bytes[r] += nbytes
                read[r] += nbytes
            continue
        allowed = readers.get(i) if readers else None
        pool = sorted(r for r in needers if allowed is None or r in allowed) or sorted(allowed or needers)
        heap = [(load.bytes[r], r) for r in pool]
        heapq.heapify(heap)
        mine: dict[int, int] = {}
        for start in range(0, nbytes, chunk):
            length = min(chunk, nbytes - start)
            assigned, reader = heapq.heappop(heap)
            heapq.heappush(heap, (assigned + length, reader))
            load.bytes[reader] = assigned + length
            mine[reader] = mine.get(reader, 0) + length
            sent[reader] += length * (len(needers) - (reader in needers))
        for r, got in mine.items():
            read[r] += got
        for r in needers:
            received[r] += nbytes - mine.get(r, 0)
    return ReadShares(read=read, sent=sent, received=received)
