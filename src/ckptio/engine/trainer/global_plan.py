"""The coordinator's half of save planning, at the cost of one pass over the job's items.

A planning save (the first one, and one whose state structure changed) sends every rank's local plan to rank 0,
which runs DCP's global planning and sends each rank its final plan; every rank waits for it. With DCP's own
objects that costs rank 0 seconds of CPU at thousands of ranks, most of it not planning: unpickling every rank's
``SavePlan`` (a ``torch.Size`` per offset, a dataclass per item), ``dataclasses.replace`` and
``MetadataIndex.__init__`` per item, pickling every final plan, and the garbage collector's passes over all of it.

So the ranks speak in plain values instead:

1. each rank sends :func:`encode_local_plan` of its local plan: per item its name, offsets, sizes and kind as
   tuples of ints and strings, its ``TensorProperties`` once per distinct value;
2. rank 0's :func:`plan_globally` runs DCP's global planning on those values — the same de-duplication (an item
   several plans hold stays in the one with the least storage so far, in first-seen order), the same index hints,
   metadata, planner data and validation — and answers each rank with one int per item: dropped, kept, or kept
   with an index hint;
3. each rank's :func:`finish_local_plan` applies its answer to its own local plan, building exactly the final plan
   DCP's coordinator would have sent.

The result must stay identical to DCP's: ``tests/engine/test_global_plan.py`` compares both field by field on
sharded, replicated, object and mixed plans. A planner other than DCP's default (or configured differently) is
planned by DCP itself (:func:`plans_compactly`). This module never performs I/O and runs no collective.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from bisect import bisect_right, insort
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType

DROPPED = -1
"""An answer for an item another rank writes."""
KEPT = -2
"""An answer for a kept item without an index hint (an object)."""
_BYTE_IO = WriteItemType.BYTE_IO.value
_SHARD = WriteItemType.SHARD.value

Box = tuple[tuple[int, ...], tuple[int, ...]]
CompactItem = tuple[str, Any, int, Any, Any, Any, int]
"""(fqn, index offset or None, kind, chunk offsets, chunk sizes, global size, properties number): tuples of ints."""
CompactPlan = tuple[tuple[CompactItem, ...], tuple[TensorProperties, ...], Any]
"""A rank's items, its distinct tensor properties, and its planner data."""


def plans_compactly(planner: DefaultSavePlanner) -> bool:
    """True for exactly the planner this module reproduces: DCP's default, flattening, no plan caching."""
    return (type(planner) is DefaultSavePlanner and planner.flatten_state_dict
            and not planner.dedup_save_to_lowest_rank and not getattr(planner, "_enable_plan_caching", False))


def encode_local_plan(plan: SavePlan) -> CompactPlan:
    """What a rank sends the coordinator: its local plan as plain values (cheap to pickle and unpickle)."""
    props: list[TensorProperties] = []
    items: list[CompactItem] = []
    for item in plan.items:
        offset = None if item.index.offset is None else tuple(item.index.offset)
        data = item.tensor_data
        if data is None:
            items.append((item.index.fqn, offset, item.type.value, None, None, None, -1))
            continue
        number = next((n for n, p in enumerate(props) if p == data.properties), len(props))
        if number == len(props):
            props.append(data.properties)
        chunk = data.chunk
        chunk_offsets = offset if offset == tuple(chunk.offsets) else tuple(chunk.offsets)  # one object when equal
        items.append((item.index.fqn, offset, item.type.value, chunk_offsets, tuple(chunk.sizes), tuple(data.size),
                      number))
    return tuple(items), tuple(props), plan.planner_data


def plan_globally(plans: Sequence[CompactPlan]) -> tuple[list[tuple[int, ...]], Metadata]:
    """The coordinator: each rank's answer (one int per item of its local plan: :data:`DROPPED`, :data:`KEPT`, or
    the index hint of a kept tensor item) and the metadata without storage_data. Raises ``ValueError`` as DCP does
    when the chunks do not tile their tensors."""
    with collector_paused():
        dropped = _dropped(plans)
        answers, metadata, boxes = _answers_and_metadata(plans, dropped)
        errors = _validation_errors(metadata, boxes, len(plans))
    if errors:
        raise ValueError(f"Failed to validate global plan: {'; '.join(errors)[:500]}")
    return answers, metadata


def finish_local_plan(plan: SavePlan, answer: Sequence[int]) -> SavePlan:
    """This rank's final plan, exactly as DCP's coordinator would have built it: its kept items, each tensor item
    with its index hint."""
    items = []
    for item, hint in zip(plan.items, answer, strict=True):
        if hint == KEPT:
            items.append(item)
        elif hint != DROPPED:
            items.append(dataclasses.replace(item, index=dataclasses.replace(item.index, index=hint)))
    return dataclasses.replace(plan, items=items)


def global_save_plan(planner: DefaultSavePlanner, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
    """Every rank's final plan and the metadata, as ``planner.create_global_plan(all_plans)`` returns them: the
    three steps above in one process (tests and benches; a job runs them on its ranks)."""
    if not plans_compactly(planner):
        return planner.create_global_plan(all_plans)
    answers, metadata = plan_globally([encode_local_plan(plan) for plan in all_plans])
    return [finish_local_plan(p, a) for p, a in zip(all_plans, answers, strict=True)], metadata


@contextmanager
def collector_paused() -> Iterator[None]:
    """The pass makes no reference cycles; collections over the hundreds of thousands of objects it makes would
    cost more than the pass itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _dropped(plans: Sequence[CompactPlan]) -> list[set[int]]:
    """DCP's ``dedup_save_plans``: per plan, the positions of the items another plan writes. An item several plans
    hold stays in the one with the least storage so far (first-seen order; ties to the lowest rank; sized by the
    tensor's global size, as DCP's ``tensor_storage_size``)."""
    holders: dict[tuple[str, Any], list[Any]] = {}  # (fqn, offset) -> [last holder's item, rank, position, ...]
    for rank, (items, props, _) in enumerate(plans):
        for position, item in enumerate(items):
            key = (item[0], item[1])
            entry = holders.get(key)
            if entry is None:
                holders[key] = [(item, props), rank, position]
            elif entry[-2] != rank:
                entry[0] = (item, props)
                entry += (rank, position)
    size = [0] * len(plans)
    nbytes: dict[str, int] = {}  # every item of a name has its tensor's global size and dtype: one storage size
    dropped: list[set[int]] = [set() for _ in plans]
    for (fqn, _), entry in holders.items():
        stored = nbytes.get(fqn)
        if stored is None:
            stored = nbytes[fqn] = _storage_size(*entry[0])
        if len(entry) == 3:
            size[entry[1]] += stored
            continue
        chosen = min(entry[1::2], key=size.__getitem__)
        size[chosen] += stored
        for rank, position in zip(entry[1::2], entry[2::2], strict=True):
            if rank != chosen:
                dropped[rank].add(position)
    return dropped


def _storage_size(item: CompactItem, props: Sequence[TensorProperties]) -> int:
    if item[5] is None:
        return 1  # DCP counts an object as 1: its size is not known
    element_size: int = torch._utils._element_size(props[item[6]].dtype)
    return math.prod(item[5]) * element_size


def _answers_and_metadata(plans: Sequence[CompactPlan], dropped: Sequence[set[int]],
                          ) -> tuple[list[tuple[int, ...]], Metadata, dict[str, list[Box]]]:
    """DCP's ``create_default_global_save_plan`` (index hints rewritten) and the merged planner data; also each
    tensor's chunks as plain boxes for the validation."""
    md: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    boxes: dict[str, list[Box]] = {}
    answers = []
    for (items, props, _), gone in zip(plans, dropped, strict=True):
        answer = []
        for position, item in enumerate(items):
            answer.append(DROPPED if position in gone else _describe(md, boxes, item, props))
        answers.append(tuple(answer))
    merged: dict[str, Any] = {}
    for _, _, planner_data in reversed(plans):  # the first plan that maps a key wins, as DCP's ChainMap does
        merged.update(planner_data)
    return answers, Metadata(md, planner_data=merged), boxes


def _describe(md: dict[str, TensorStorageMetadata | BytesStorageMetadata], boxes: dict[str, list[Box]],
              item: CompactItem, props: Sequence[TensorProperties]) -> int:
    """Add a kept item to the metadata; its answer (the chunk's place in its tensor's list, or :data:`KEPT`)."""
    fqn, _, kind, offsets, sizes, size, number = item
    if kind != _SHARD and fqn in md:
        raise AssertionError("item.index.fqn not in md")
    if kind == _BYTE_IO:
        md[fqn] = BytesStorageMetadata()
        return KEPT
    if offsets is None or size is None:
        raise AssertionError(f"Cannot create MD for tensor without bounds. FQN: {fqn}")
    entry = md.get(fqn)
    if entry is None:
        entry = md[fqn] = TensorStorageMetadata(properties=props[number], size=torch.Size(size), chunks=[])
        boxes[fqn] = []
    assert isinstance(entry, TensorStorageMetadata)
    hint = len(entry.chunks)
    entry.chunks.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
    boxes[fqn].append((offsets, sizes))
    return hint


def _validation_errors(metadata: Metadata, boxes: dict[str, list[Box]], n_plans: int) -> list[str]:
    """DCP's ``_validate_global_plan``: every chunk inside its tensor, no two chunks overlapping, and (with more
    than one plan) the chunks' volume equal to the tensor's."""
    errors: list[str] = []
    for key, value in metadata.state_dict_metadata.items():
        if isinstance(value, BytesStorageMetadata) or len(value.size) == 0:
            continue
        size, chunks = tuple(value.size), boxes[key]
        volume = 0
        for n, (offsets, sizes) in enumerate(chunks):
            if any(o < 0 or s < 0 or o + s > bound for o, s, bound in zip(offsets, sizes, size, strict=True)):
                errors.append(f"key:{key} has out of bounds chunk: tensor-size:{value.size} chunk: {value.chunks[n]}")
            volume += math.prod(sizes)
        if len(chunks) > 1:
            errors += [f"key:{key} has overlapping chunks: {value.chunks[a]} {value.chunks[b]}"
                       for a, b in _overlaps(chunks, size)]
        if n_plans > 1 and volume != math.prod(size):
            errors.append(f"key:{key} invalid fill tensor-volume: {math.prod(size)} chunks-volume: {volume}")
    return errors


def _overlaps(chunks: Sequence[Box], size: tuple[int, ...]) -> list[tuple[int, int]]:
    """Pairs of overlapping chunks: a sweep along the tensor's longest dimension, as DCP's validation does."""
    dims = len(size)
    sweep = max(range(dims), default=0, key=lambda d: size[d])
    order = sorted((offsets[sweep], offsets, i) for i, (offsets, _) in enumerate(chunks))
    active: list[tuple[int, int]] = []
    found = []
    for start, offsets, i in order:
        sizes = chunks[i][1]
        cutoff = bisect_right(active, (start, 1 << 62))
        if cutoff:
            del active[:cutoff]
        for _, j in active:
            other_offsets, other_sizes = chunks[j]
            if all(offsets[d] < other_offsets[d] + other_sizes[d] and other_offsets[d] < offsets[d] + sizes[d]
                   for d in range(dims)):
                found.append((i, j))
        insort(active, (start + sizes[sweep], i))
    return found
