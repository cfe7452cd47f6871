"""Everything that speaks PyTorch DCP: save planning, ``.metadata`` building, and the StorageReader for restore.

ckptio reuses DCP's own planners (``DefaultSavePlanner``: flattening, DTensor chunks, de-duplication of replicated
tensors across ranks), so what it writes is exactly what ``torch.distributed.checkpoint.load`` expects, at any world
size. Only the *execution* differs: the plan is computed once per state structure (rank 0 gathers the local plans on
ckptio's side group and sends each rank its own final plan), and each save just copies tensors into the staging
slot.

This module never performs I/O on the training thread except through ``CkptioStorageReader`` during restore.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import StorageReader
from torch.distributed.tensor import DTensor
from torch.futures import Future

from ckptio.engine.group import SideGroup
from ckptio.errors import CorruptCheckpointError, StructureMismatchError, UnsupportedStateError
from ckptio.format import FileRecord, Manifest, RankIndex, check_file, step_dir
from ckptio.format.crosscheck import metadata_problems
from ckptio.format.safe_pickle import load_metadata, load_object
from ckptio.storage.base import Storage, join_key

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
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            if value.is_sparse or value.layout != torch.strided:
                raise UnsupportedStateError(f"{fqn!r}: sparse/non-strided tensors are not supported", path=fqn)
            if value.device.type == "meta":
                raise UnsupportedStateError(f"{fqn!r}: tensor on the meta device has no data", path=fqn)


def global_plan(planner: DefaultSavePlanner, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
    """The coordinator's half of planning: DCP's global planning (de-duplication of replicated items, chunk
    validation, metadata) over every rank's local plan. Returns each rank's final plan, in rank order, and the
    metadata (without storage_data). Linear in the total number of items."""
    return planner.create_global_plan(all_plans)


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
    """Plan a save with every rank (all call together): rank 0 gathers the local plans, runs :func:`global_plan`
    and sends each rank its own final plan, as DCP does. O(N) bytes across the job; each rank receives one plan."""
    planner = make_planner(state_dict, is_coordinator=group.rank == 0)
    differed = planner.state_dict.keys() != flat.keys()
    all_plans = group.gather_to_rank0(planner.create_local_plan())
    final_plans, metadata = global_plan(planner, all_plans) if all_plans is not None else (None, None)
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


# ---- metadata ----------------------------------------------------------------------------------------------------
def build_metadata(skeleton: Metadata, indexes: Sequence[RankIndex], checkpoint_id: str) -> Metadata:
    """Complete DCP's global metadata with where every item landed (``storage_data``)."""
    storage_data: dict[MetadataIndex, _StorageInfo] = {}
    for index in indexes:
        for it in index.items:
            key = MetadataIndex(it.fqn, it.offset, it.index_hint)
            storage_data[key] = _StorageInfo(it.file, it.file_offset, it.length)
    return Metadata(
        state_dict_metadata=skeleton.state_dict_metadata,
        planner_data=skeleton.planner_data,
        storage_data=storage_data,
        storage_meta=StorageMeta(checkpoint_id=checkpoint_id),
        version=CURRENT_DCP_VERSION,
    )


# ---- restore -----------------------------------------------------------------------------------------------------
class CkptioStorageReader(StorageReader):
    """A DCP StorageReader over any ckptio storage: whole-file reads, checksums verified, local tier preferred.

    ``torch.distributed.checkpoint.load(sd, storage_reader=CkptioStorageReader(storage, step))`` reads a ckptio
    checkpoint from POSIX or S3 at any world size.

    It runs no code from the store: ``.metadata`` is unpickled with an allowlist of DCP's metadata classes, every
    item must lie inside a file the manifest lists, and non-tensor values load with ``weights_only`` semantics
    plus ``safe_globals`` (``trust_pickles=True`` is the explicit opt-in to arbitrary pickles; docs/security.md).
    """

    def __init__(
        self,
        storage: Storage,
        step: int,
        *,
        manifest: Manifest | None = None,
        local: Storage | None = None,
        concurrency: int = 4,
        trust_pickles: bool = False,
        safe_globals: Sequence[Any] = (),
    ) -> None:
        from ckptio.format import read_manifest

        self.storage = storage
        self.step = step
        self.manifest = manifest or read_manifest(storage, step)
        self.local = local
        self.concurrency = concurrency
        self.trust_pickles = trust_pickles
        self.safe_globals = tuple(safe_globals)
        self.storage_data: dict[MetadataIndex, _StorageInfo] = {}
        self._metadata: Metadata | None = None
        #: files served from the local tier in the last read_data (for reports and tests)
        self.local_hits: list[str] = []

    def reset(self, checkpoint_id: Any = None) -> None:
        self.local_hits = []

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checked metadata, read once: restore reads it before ``dcp.load`` so that a refusal surfaces as
        ckptio's own error rather than inside DCP's wrapping."""
        if self._metadata is not None:
            return self._metadata
        name = ".metadata"
        key = self.metadata_key()
        raw = self.storage.get(key)
        if self.manifest.metadata_crc32c:
            check_file(self.storage, self.step, name, raw,
                       FileRecord(name=name, size=len(raw), crc32c=self.manifest.metadata_crc32c))
        try:
            metadata = cast(Metadata, load_metadata(raw, path=key, trust_pickles=self.trust_pickles))
        except CorruptCheckpointError as exc:
            raise self._located(exc) from exc.__cause__
        problems = metadata_problems(metadata, self.manifest)
        if problems:
            # Reads must stay inside the files the manifest lists (and checksums): never a KeyError or a short read.
            raise CorruptCheckpointError(f".metadata disagrees with the manifest: {problems[0]}",
                                         root=self.storage.url, step=self.step, path=key)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        self._metadata = metadata
        return metadata

    def metadata_key(self) -> str:
        """Where ``.metadata`` is read from (the local level's reader, issue 10, reads its own)."""
        return join_key(step_dir(self.step), ".metadata")

    def _located(self, exc: CorruptCheckpointError) -> CorruptCheckpointError:
        exc.root, exc.step = exc.root or self.storage.url, self.step
        return exc

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _fetch(self, name: str) -> bytes:
        """One whole data file, from the local tier when its copy matches the manifest, else durable."""
        rec = self.manifest.files[name]
        key = join_key(step_dir(self.step), name)  # the local tier never hashes keys
        if self.local is not None:
            try:
                data = self.local.get(key)
                check_file(self.local, self.step, name, data, rec)
                self.local_hits.append(name)
                return data
            except Exception:  # missing or damaged local copy: the durable tier decides
                pass
        data = self.storage.get(rec.key or key)
        check_file(self.storage, self.step, name, data, rec)
        return data

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        names = sorted(per_file)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            # Bounded look-ahead: at most `concurrency` files are held in memory at once.
            for start in range(0, len(names), self.concurrency):
                batch = names[start : start + self.concurrency]
                for name, data in zip(batch, pool.map(self._fetch, batch), strict=True):
                    self._apply(per_file[name], memoryview(data), planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _apply(self, reqs: list[Any], data: memoryview, planner: LoadPlanner) -> None:
        for req in reqs:
            info = self.storage_data[req.storage_index]
            blob = data[info.offset : info.offset + info.length]
            if req.type == LoadItemType.BYTE_IO:
                self._load_object(req, blob, planner)
                continue
            tensor = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise StructureMismatchError(
                    f"{req.storage_index.fqn!r}: checkpoint has shape {tuple(tensor.size())}, "
                    f"target has {tuple(target.size())}",
                    step=self.step,
                    path=req.storage_index.fqn,
                )
            target.copy_(tensor)
            planner.commit_tensor(req, target)

    def _load_object(self, req: Any, blob: memoryview, planner: LoadPlanner) -> None:
        """A non-tensor value: loaded here with the allowlist, never by DCP's planner (which unpickles anything)."""
        if self.trust_pickles:
            planner.load_bytes(req, io.BytesIO(blob))
            return
        try:
            value = load_object(blob, safe_globals=self.safe_globals, path=req.storage_index.fqn)
        except CorruptCheckpointError as exc:
            raise self._located(exc) from exc.__cause__
        if isinstance(planner, DefaultLoadPlanner) and type(planner).load_bytes is DefaultLoadPlanner.load_bytes:
            # What DefaultLoadPlanner.load_bytes does after its torch.load(weights_only=False).
            if planner.flatten_state_dict:
                set_element(planner.original_state_dict, planner.mappings[req.dest_index.fqn], value)
            else:
                planner.state_dict[req.dest_index.fqn] = value
            return
        # A custom planner loads bytes its own way: hand it a re-serialization of the value the allowlisted load
        # built, so whatever it unpickles names only classes that load admitted.
        buf = io.BytesIO()
        torch.save(value, buf)
        buf.seek(0)
        planner.load_bytes(req, buf)
