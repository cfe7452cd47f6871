"""The plain-value global planner gives exactly what DCP's ``DefaultSavePlanner.create_global_plan`` gives.

Equality is checked field by field, index hints included (``MetadataIndex`` equality ignores them), on plans built
by hand (row shards, replicated tensors of uneven sizes that exercise DCP's balancing, objects) and on local plans
DCP builds from real state dicts; invalid plans raise the same ``ValueError``; other planners go to DCP itself.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

from ckptio.engine.trainer.global_plan import encode_local_plan, finish_local_plan, global_save_plan, plan_globally
from ckptio.engine.trainer.rank_plan import make_planner


def _item(fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...], size: tuple[int, ...], *,
          kind: WriteItemType = WriteItemType.SHARD, dtype: torch.dtype = torch.float32) -> WriteItem:
    chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
    return WriteItem(index=MetadataIndex(fqn, torch.Size(offsets)), type=kind,
                     tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties(dtype=dtype),
                                                 size=torch.Size(size)))


def synthetic_plans(n: int) -> list[SavePlan]:
    """Row shards of two tensors, replicated tensors of different sizes (the balancing picks different ranks for
    them), and an object, on every rank; one rank holds an extra replicated tensor only it and its neighbour have."""
    plans = []
    for rank in range(n):
        items = [_item(f"w{i}", (rank * 3, 0), (3, 5), (n * 3, 5)) for i in range(2)]
        items += [_item(f"r{i}", (0,), (7 * (i + 1),), (7 * (i + 1),), kind=WriteItemType.TENSOR) for i in range(3)]
        if rank in (1, 2):
            items.append(_item("pair", (0, 0), (2, 2), (2, 2), kind=WriteItemType.TENSOR, dtype=torch.int64))
        items.append(WriteItem(index=MetadataIndex("obj"), type=WriteItemType.BYTE_IO))
        plans.append(SavePlan(items=items, planner_data={item.index.fqn: (item.index.fqn, str(rank))
                                                         for item in items}))
    return plans


def real_plans(n: int) -> list[SavePlan]:
    torch.manual_seed(0)
    state = {"model": {"a": torch.randn(4, 3), "b": torch.arange(10)}, "step": 3, "opt": {"m": [torch.ones(2)]}}
    return [make_planner(state, is_coordinator=rank == 0).create_local_plan() for rank in range(n)]


def assert_same(ours: tuple[list[SavePlan], object], dcp: tuple[list[SavePlan], object]) -> None:
    (our_plans, our_md), (dcp_plans, dcp_md) = ours, dcp
    assert our_plans == dcp_plans
    for mine, theirs in zip(our_plans, dcp_plans, strict=True):
        assert [i.index.index for i in mine.items] == [i.index.index for i in theirs.items]
        assert mine.planner_data == theirs.planner_data
    assert our_md == dcp_md


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("make", [synthetic_plans, real_plans])
def test_same_plans_and_metadata_as_dcp(n, make):
    assert_same(global_save_plan(make_planner({}, is_coordinator=True), make(n)),
                make_planner({}, is_coordinator=True).create_global_plan(make(n)))


def test_an_invalid_plan_raises_as_dcp_does():
    plans = synthetic_plans(2)
    plans[1].items[0] = _item("w0", (1, 0), (3, 5), (6, 5))  # overlaps rank 0's rows 0-2
    with pytest.raises(ValueError, match="overlapping chunks") as dcp:
        make_planner({}, is_coordinator=True).create_global_plan(plans)
    with pytest.raises(ValueError, match="overlapping chunks") as ours:
        global_save_plan(make_planner({}, is_coordinator=True), plans)
    assert str(ours.value).split(";")[0] == str(dcp.value).split(";")[0]


def test_an_out_of_bounds_chunk_raises():
    plans = synthetic_plans(2)
    plans[1].items[0] = _item("w0", (4, 0), (3, 5), (6, 5))
    with pytest.raises(ValueError, match="out of bounds"):
        global_save_plan(make_planner({}, is_coordinator=True), plans)


def test_another_planner_is_planned_by_dcp(monkeypatch):
    planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    planner.set_up_planner(state_dict={}, storage_meta=None, is_coordinator=True)
    calls = []
    monkeypatch.setattr(DefaultSavePlanner, "create_global_plan",
                        lambda self, plans: calls.append(len(plans)) or ([], None))
    global_save_plan(planner, synthetic_plans(3))
    assert calls == [3]


def test_the_plain_values_cross_a_pickle_as_the_gather_sends_them():
    plans = real_plans(3)
    answers, metadata = plan_globally([pickle.loads(pickle.dumps(encode_local_plan(p))) for p in plans])
    ours = [finish_local_plan(p, pickle.loads(pickle.dumps(a))) for p, a in zip(plans, answers, strict=True)]
    assert_same((ours, metadata), make_planner({}, is_coordinator=True).create_global_plan(real_plans(3)))
