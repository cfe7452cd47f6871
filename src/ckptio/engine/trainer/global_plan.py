"""The coordinator's half of save planning, at the cost of one pass over the job's items.

A planning save (the first one, and one whose state structure changed) sends every rank's local plan to rank 0,
which runs DCP's global planning and sends each rank its final plan; every rank waits for it. DCP's own
``DefaultSavePlanner.create_global_plan`` spends most of its time building objects through
``dataclasses.replace`` and ``MetadataIndex.__init__`` (a ``torch.Size`` per item): seconds at thousands of ranks.
:func:`global_save_plan` computes the same result for the default planner — the same de-duplication (each
replicated item goes to the plan with the least storage so far, in DCP's order), the same index hints, the same
metadata and planner data, the same validation — with plain dict and list work, and the garbage collector
paused (the pass makes no reference cycles).

The result must stay identical to DCP's: ``tests/engine/test_global_plan.py`` compares both on sharded,
replicated, object and mixed plans, and a planner other than ``DefaultSavePlanner`` (or one configured
differently) is planned by DCP itself. This module never performs I/O and runs no collective.
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_right, insort
from collections.abc import Sequence
from typing import Any

from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType


def global_save_plan(planner: DefaultSavePlanner, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
    """Each rank's final plan, in rank order, and the metadata (without storage_data): what
    ``planner.create_global_plan(all_plans)`` returns, computed in one pass when ``planner`` is DCP's default.

    It takes ``all_plans`` over (the coordinator's freshly gathered copies): their kept tensor items get their
    index hints in place instead of being rebuilt. The garbage collector is paused meanwhile: the pass makes no
    reference cycles, and collections of the young generation over hundreds of thousands of new objects cost more
    than the pass itself."""
    if not _is_default(planner):
        return planner.create_global_plan(all_plans)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        final_plans, metadata = _with_index_hints(all_plans, _dropped(all_plans))
        errors = _validation_errors(metadata, len(final_plans))
    finally:
        if was_enabled:
            gc.enable()
    if errors:
        raise ValueError(f"Failed to validate global plan: {'; '.join(errors)[:500]}")
    planner.global_plan, planner.metadata = final_plans, metadata
    return final_plans, metadata


def _is_default(planner: DefaultSavePlanner) -> bool:
    """True for exactly the planner this module reproduces: DCP's default, flattening, no plan caching."""
    return (type(planner) is DefaultSavePlanner and planner.flatten_state_dict
            and not planner.dedup_save_to_lowest_rank and not getattr(planner, "_enable_plan_caching", False))


def _dropped(all_plans: Sequence[SavePlan]) -> list[set[int]]:
    """DCP's ``dedup_save_plans``: an item several plans hold stays in the one with the least storage planned so
    far (items visited in first-seen order, ties to the lowest rank, sized by the last plan that holds them).
    Returns, per plan, the positions of the items it drops."""
    holders: dict[tuple[str, Any], list[Any]] = {}  # (fqn, offset) -> [last item, rank, position, rank, ...]
    for rank, plan in enumerate(all_plans):
        for position, item in enumerate(plan.items):
            key = (item.index.fqn, item.index.offset)
            entry = holders.get(key)
            if entry is None:
                holders[key] = [item, rank, position]
            elif entry[-2] != rank:
                entry[0] = item
                entry += (rank, position)
    size = [0] * len(all_plans)
    nbytes: dict[str, int] = {}  # every item of one fqn has the tensor's global size and dtype: one storage size
    dropped: list[set[int]] = [set() for _ in all_plans]
    for (fqn, _), entry in holders.items():
        stored = nbytes.get(fqn)
        if stored is None:
            stored = nbytes[fqn] = entry[0].tensor_storage_size() or 1
        if len(entry) == 3:
            size[entry[1]] += stored
            continue
        chosen = min(entry[1::2], key=size.__getitem__)
        size[chosen] += stored
        for rank, position in zip(entry[1::2], entry[2::2], strict=True):
            if rank != chosen:
                dropped[rank].add(position)
    return dropped


def _with_index_hints(all_plans: Sequence[SavePlan],
                      dropped: Sequence[set[int]]) -> tuple[list[SavePlan], Metadata]:
    """DCP's ``create_default_global_save_plan`` with index hints rewritten, and the merged planner data."""
    md: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    plans = []
    for plan, gone in zip(all_plans, dropped, strict=True):
        items = [item for n, item in enumerate(plan.items) if n not in gone] if gone else plan.items
        for item in items:
            _describe(md, item)
        plans.append(_copy(plan, items=items) if gone else plan)
    merged: dict[str, Any] = {}
    for plan in reversed(plans):  # the first plan that maps a key wins, as DCP's ChainMap does
        merged.update(plan.planner_data)
    return plans, Metadata(md, planner_data=merged)


def _describe(md: dict[str, TensorStorageMetadata | BytesStorageMetadata], item: WriteItem) -> None:
    """Add ``item`` to the metadata and give a tensor item its index hint (its chunk's place in the list)."""
    fqn = item.index.fqn
    if item.type != WriteItemType.SHARD and fqn in md:
        raise AssertionError("item.index.fqn not in md")
    if item.type == WriteItemType.BYTE_IO:
        md[fqn] = BytesStorageMetadata()
        return
    data = item.tensor_data
    if data is None or data.chunk is None:
        raise AssertionError(f"Cannot create MD for tensor without bounds. FQN: {fqn}")
    entry = md.get(fqn)
    if entry is None:
        entry = md[fqn] = TensorStorageMetadata(properties=data.properties, size=data.size, chunks=[])
    assert isinstance(entry, TensorStorageMetadata)
    object.__setattr__(item.index, "index", len(entry.chunks))  # a hint: equality and hashing ignore it
    entry.chunks.append(data.chunk)


def _copy(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for DCP's frozen dataclasses without re-running their ``__init__``."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def _validation_errors(metadata: Metadata, n_plans: int) -> list[str]:
    """DCP's ``_validate_global_plan``: every chunk inside its tensor, no two chunks overlapping, and (with more
    than one plan) the chunks' volume equal to the tensor's."""
    errors: list[str] = []
    for key, value in metadata.state_dict_metadata.items():
        if isinstance(value, BytesStorageMetadata) or len(value.size) == 0:
            continue
        size, chunks = value.size, value.chunks
        volume = 0
        for chunk in chunks:
            offsets, sizes = chunk.offsets, chunk.sizes
            if any(o < 0 or s < 0 or o + s > bound for o, s, bound in zip(offsets, sizes, size, strict=True)):
                errors.append(f"key:{key} has out of bounds chunk: tensor-size:{size} chunk: {chunk}")
            volume += math.prod(sizes)
        if len(chunks) > 1:
            errors += [f"key:{key} has overlapping chunks: {chunks[a]} {chunks[b]}" for a, b in _overlaps(chunks, size)]
        if n_plans > 1 and volume != math.prod(size):
            errors.append(f"key:{key} invalid fill tensor-volume: {math.prod(size)} chunks-volume: {volume}")
    return errors


def _overlaps(chunks: Sequence[Any], size: Sequence[int]) -> list[tuple[int, int]]:
    """Pairs of overlapping chunks: a sweep along the tensor's longest dimension, as DCP's validation does."""
    dims = len(size)
    sweep = max(range(dims), default=0, key=lambda d: size[d])
    order = sorted((c.offsets[sweep], tuple(c.offsets), i) for i, c in enumerate(chunks))
    active: list[tuple[int, int]] = []
    found = []
    for start, _, i in order:
        offsets, sizes = chunks[i].offsets, chunks[i].sizes
        cutoff = bisect_right(active, (start, 1 << 62))
        if cutoff:
            del active[:cutoff]
        for _, j in active:
            other_offsets, other_sizes = chunks[j].offsets, chunks[j].sizes
            if all(offsets[d] < other_offsets[d] + other_sizes[d] and other_offsets[d] < offsets[d] + sizes[d]
                   for d in range(dims)):
                found.append((i, j))
        insort(active, (start + sizes[sweep], i))
    return found
