"""DCP's save planning, run once per state structure: each rank's :class:`RankPlan` of what it writes. The
``.metadata`` built from it at commit time is :mod:`ckptio.engine.writer.dcp_metadata`'s.

ckptio reuses DCP's own planners (``DefaultSavePlanner``: flattening, DTensor chunks, de-duplication of replicated
tensors across ranks), so what it writes is exactly what ``torch.distributed.checkpoint.load`` expects, at any world
size. Only the *execution* differs: the plan is computed once per state structure (rank 0 gathers the local plans on
ckptio's side group and sends each rank its own final plan), and each save just copies tensors into the staging
slot.

This module never performs I/O.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    SavePlan,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from ckptio.engine.side_group import SideGroup
from ckptio.engine.trainer.global_plan import (
    collector_paused,
    encode_local_plan,
    finish_local_plan,
    global_save_plan,
    plan_globally,
    plans_compactly,
)
from ckptio.errors import UnsupportedStateError

# ---- save planning ------------------------------------------------------------------------------------------------
_PLAIN = (torch.Tensor, int, float, str, bytes, bool)


def statefuls_to_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """Like DCP: top-level ``Stateful`` values are replaced by their ``state_dict()``."""
    if not isinstance(state, dict):
        raise UnsupportedStateError(f"state must be a dict, got {type(state).__name__}")
    # Stateful is a runtime-checkable Protocol (an isinstance costs an inspect.getattr_static walk): tensors and
    # plain values, the bulk of a flat state, skip it.
    return {k: v if isinstance(v, _PLAIN) or v is None or not isinstance(v, Stateful) else v.state_dict()
            for k, v in state.items()}


def flatten_like_dcp(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The flat ``{fqn: value}`` DCP's planner builds (same rules as its ``traverse_state_dict``: mappings are
    walked, lists only when they hold tensors or walkable containers, tuples and other values are leaves).

    DCP's generic traversal costs tens of milliseconds per save on a state of thousands of tensors; this one is a
    few. The checkpointer compares its keys with the planner's whenever it re-plans, and falls back to the
    planner when they differ, so a divergence can cost speed, never correctness.
    """
    flat: dict[str, Any] = {}

    def walkable_list(value: list[Any]) -> bool:
        return any(isinstance(e, (torch.Tensor, Mapping)) or (isinstance(e, list) and walkable_list(e))
                   for e in value)

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(f"{prefix}.{k}", v)
        elif isinstance(value, list) and walkable_list(value):
            for i, v in enumerate(value):
                visit(f"{prefix}.{i}", v)
        else:
            flat[prefix] = value

    for key, value in state_dict.items():
        visit(str(key), value)
    return flat


def quick_fingerprint(flat: dict[str, Any]) -> int:
    """A process-local digest of keys, kinds, dtypes, shapes, layouts and placements (cheap: no hashing of
    reprs). It only decides whether this rank re-plans; ranks exchange a changed/unchanged bit, never this."""
    parts: list[tuple[str, Any, Any]] = []
    for fqn, value in flat.items():
        if isinstance(value, torch.Tensor):
            parts.append((fqn, _describe(value), value.layout))
        else:
            parts.append((fqn, None, None))
    return hash(tuple(parts))


def make_planner(state_dict: dict[str, Any], *, is_coordinator: bool) -> DefaultSavePlanner:
    """DCP's planner over a state whose Statefuls were already turned into state dicts."""
    planner = DefaultSavePlanner()
    planner.set_up_planner(state_dict=state_dict, storage_meta=None, is_coordinator=is_coordinator)
    return planner


def _describe(value: Any) -> tuple[Any, ...]:
    if isinstance(value, DTensor):
        mesh = value.device_mesh
        return ("dtensor", str(value.dtype), tuple(value.shape), tuple(value.to_local().shape),
                str(value.placements), tuple(mesh.mesh.shape))
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.device.type)
    return ("object",)


def check_supported(flat: dict[str, Any]) -> None:
    """Reject values that cannot be staged, naming the key."""
    for fqn, value in flat.items():
        if isinstance(value, ShardedTensor):  # its attributes raise through __torch_function__: test it first
            raise UnsupportedStateError(
                f"{fqn!r}: ShardedTensor (torch.distributed._shard, PyTorch's legacy sharded type) is not supported; "
                "convert it to a DTensor (torch.distributed.tensor), which ckptio saves and DCP reshards", path=fqn)
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            if value.is_sparse or value.layout != torch.strided:
                raise UnsupportedStateError(f"{fqn!r}: sparse/non-strided tensors are not supported", path=fqn)
            if value.device.type == "meta":
                raise UnsupportedStateError(f"{fqn!r}: tensor on the meta device has no data", path=fqn)


def global_plan(planner: DefaultSavePlanner, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
    """The coordinator's half of planning in one process: DCP's global planning (de-duplication of replicated
    items, chunk validation, metadata) over every rank's local plan, as ``engine.trainer.global_plan`` computes it.
    Returns each rank's final plan, in rank order, and the metadata (without storage_data)."""
    return global_save_plan(planner, all_plans)


@dataclass(frozen=True, slots=True)
class RankPlan:
    """One rank's share of a coordinated save plan."""

    flat: dict[str, Any]
    """The flat state to stage from: DCP's own flattening when it disagreed with the quick one."""
    flattening_differed: bool
    tensor_items: list[WriteItem]
    object_items: list[WriteItem]
    metadata_skeleton: bytes | None
    """Rank 0 only: the pickled DCP Metadata without storage_data (the committer completes it)."""


def coordinated_plan(state_dict: dict[str, Any], flat: dict[str, Any], group: SideGroup) -> RankPlan:
    """Plan a save with every rank (all call together): rank 0 gathers the local plans, plans globally and sends
    each rank its own answer, as DCP does. O(N) bytes across the job; each rank receives only its own. DCP's
    default planner speaks in plain values (``engine.trainer.global_plan``); any other planner sends its objects."""
    planner = make_planner(state_dict, is_coordinator=group.rank == 0)
    differed = planner.state_dict.keys() != flat.keys()
    local = planner.create_local_plan()
    metadata: Metadata | None = None
    if plans_compactly(planner):
        with collector_paused():  # rank 0 unpickles every rank's plan here: no cycles, and no reason to scan them
            compact = group.gather_to_rank0(encode_local_plan(local))
        answers, metadata = plan_globally(compact) if compact is not None else (None, None)
        final = planner.finish_plan(finish_local_plan(local, group.scatter_from_rank0(answers)))
    else:
        all_plans = group.gather_to_rank0(local)
        final_plans, metadata = planner.create_global_plan(all_plans) if all_plans is not None else (None, None)
        final = planner.finish_plan(group.scatter_from_rank0(final_plans))
    tensor_items, object_items = split_items(final.items)
    skeleton = None
    if metadata is not None:
        skeleton = pickle.dumps(Metadata(state_dict_metadata=metadata.state_dict_metadata,
                                         planner_data=metadata.planner_data))
    return RankPlan(flat=planner.state_dict if differed else flat, flattening_differed=differed,
                    tensor_items=tensor_items, object_items=object_items, metadata_skeleton=skeleton)


def split_items(items: Sequence[WriteItem]) -> tuple[list[WriteItem], list[WriteItem]]:
    tensors = [i for i in items if i.type != WriteItemType.BYTE_IO]
    objects = [i for i in items if i.type == WriteItemType.BYTE_IO]
    return tensors, objects


def resolve_tensors(flat: dict[str, Any], items: Sequence[WriteItem]) -> list[torch.Tensor]:
    """The tensors (or this rank's DTensor shards) the plan's items stage, looked up in the flat state."""
    out = []
    for item in items:
        value = flat[item.index.fqn]
        shard = getattr(value, "__get_tensor_shard__", None)
        out.append((shard(item.index) if shard is not None else value).detach())
    return out


def resolve_objects(flat: dict[str, Any], items: Sequence[WriteItem]) -> list[bytes]:
    """Pickle the non-tensor values exactly as DCP does (``torch.save`` into bytes)."""
    out = []
    for item in items:
        buf = io.BytesIO()
        try:
            torch.save(flat[item.index.fqn], buf)
        except Exception as exc:  # pickling raises anything (TypeError, AttributeError, PicklingError)
            raise UnsupportedStateError(
                f"{item.index.fqn!r} cannot be serialized: {type(exc).__name__}: {exc}", path=item.index.fqn
            ) from exc
        out.append(buf.getvalue())
    return out
