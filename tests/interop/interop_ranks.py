"""What each rank of the interop suite does: save a state with plain DCP or with ckptio, load it with ckptio's reader
or DCP's own, and report per case whether every value came back bit-exact (spawned gloo ranks, real files).

The state covers what DCP's own tests exercise: a 2-D tensor laid out row-wise (``Shard(0)``), column-wise
(``Shard(1)``) or as a plain tensor, a replicated tensor, one tensor under two keys, and objects beside tensors.
"""

from __future__ import annotations

import io
import json
import os
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension, ZStandard
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import ckptio
from ckptio import CkptioStorageReader
from ckptio.errors import CkptError
from ckptio.storage import open_storage

ROWS, COLS = 96, 40  # rows and columns both split unevenly over 3 ranks


class Rot13(StreamTransformExtension):
    """A user's own stream extension, as DCP's tests have one: every byte shifted by 13 on write, back on read."""

    @staticmethod
    def registry_name() -> str:
        return "stream.rot13"

    @staticmethod
    def from_descriptor(version: str) -> Rot13:
        return Rot13()

    def get_descriptor(self) -> str:
        return f"{self.registry_name()}/1"

    def transform_to(self, output: IO[bytes]) -> IO[bytes]:
        return _Rot13Writer(output)  # type: ignore[return-value]

    def transform_from(self, input: IO[bytes]) -> IO[bytes]:
        return io.BytesIO(bytes((b - 13) % 256 for b in input.read()))


class _Rot13Writer(io.RawIOBase):
    def __init__(self, output: IO[bytes]) -> None:
        self.output = output

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(memoryview(b))
        self.output.write(bytes((x + 13) % 256 for x in data))
        return len(data)

    def flush(self) -> None:
        self.output.flush()


def full(seed: int = 1) -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(seed))


def state(layout: str, *, blank: bool = False) -> dict[str, Any]:
    """``layout``: ``rows`` / ``cols`` (a DTensor over every rank) or ``plain``; ``blank``: zeros to load into."""
    w = torch.zeros(ROWS, COLS) if blank else full()
    if layout != "plain":
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        w = distribute_tensor(w, mesh, [Shard(0) if layout == "rows" else Shard(1)])
    shared = torch.zeros(10) if blank else torch.arange(10.0)
    return {"w": w, "rep": torch.zeros(5) if blank else torch.full((5,), 3.0), "s1": shared, "s2": shared,
            "obj": {"lr": 0.0 if blank else 0.1, "tags": [] if blank else ["a", "b"]}}


def intact(st: dict[str, Any]) -> bool:
    w = st["w"].full_tensor() if isinstance(st["w"], DTensor) else st["w"]
    return (torch.equal(w, full()) and torch.equal(st["rep"], torch.full((5,), 3.0))
            and torch.equal(st["s1"], torch.arange(10.0)) and torch.equal(st["s2"], torch.arange(10.0))
            and st["obj"] == {"lr": 0.1, "tags": ["a", "b"]})


def _registry() -> ExtensionRegistry:
    registry = ExtensionRegistry()
    registry.register(Rot13)
    return registry


def load_case(reader: str, where: str, layout: str) -> dict[str, Any]:
    """Load ``where`` (``dir`` or ``root/step``) into a blank ``layout`` state with ``reader``."""
    target = state(layout, blank=True)
    try:
        if reader == "dcp":
            dcp.load(target, storage_reader=FileSystemReader(where))
        else:
            base, _, step = where.rpartition("/step-")
            storage, n = (open_storage(base), int(step)) if step.isdigit() else (open_storage(where), None)
            dcp.load(target, storage_reader=CkptioStorageReader(storage, n, extension_registry=_registry()))
    except BaseException as exc:  # reported, not raised (DCP raises a BaseException): the parent asserts
        inner = getattr(exc, "failures", None)
        cause = next(iter(inner.values())) if inner else exc
        cause = cause[0] if isinstance(cause, tuple) else cause
        return {"ok": False, "error": type(cause).__name__, "message": str(cause)[:400]}
    return {"ok": intact(target)}


def save_dcp(rank: int, world: int, path: str, threads: int, extension: str | None) -> None:
    extensions = {"zstd": [ZStandard()], "rot13": [Rot13()], None: None}[extension]
    dcp.save(state("rows"), storage_writer=FileSystemWriter(path, thread_count=threads, _extensions=extensions))


def save_ckptio(rank: int, world: int, root: str, layout: str) -> None:
    with ckptio.Checkpointer(root, volume_check="off") as ck:
        ck.save(1, state(layout)).wait(timeout=300)


def load_cases(rank: int, world: int, cases: list[list[str]], out: str, tag: str) -> None:
    """Each case ``[reader, where, layout]``; rank r's reports go to ``out/<tag>-r<r>.json``."""
    reports = {f"{reader} {where} {layout}": load_case(reader, where, layout) for reader, where, layout in cases}
    with open(os.path.join(out, f"{tag}-r{rank}.json"), "w") as f:
        json.dump(reports, f)


def sharded_tensor(rank: int, world: int, base: str, out: str) -> None:
    """A ShardedTensor: ckptio refuses to save it (naming the key); a plain dcp.save of it reads back through
    ckptio's reader into a ShardedTensor."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])

    def make(fill: float) -> Any:
        st = sharded_tensor.zeros(spec, ROWS, COLS)
        for shard in st.local_shards():
            shard.tensor.fill_(fill)
        return st

    report: dict[str, Any] = {}
    try:
        with ckptio.Checkpointer(os.path.join(base, "ck"), volume_check="off") as ck:
            ck.save(1, {"st": make(2.0)}).wait(timeout=120)
        report["refused"] = None
    except CkptError as exc:
        report["refused"] = {"error": type(exc).__name__, "message": str(exc)}
    dcp.save({"st": make(2.0)}, checkpoint_id=os.path.join(base, "plain"))
    target = {"st": make(0.0)}
    dcp.load(target, storage_reader=CkptioStorageReader(open_storage(os.path.join(base, "plain")), None))
    report["read"] = all(bool((s.tensor == 2.0).all()) for s in target["st"].local_shards())
    with open(os.path.join(out, f"sharded-r{rank}.json"), "w") as f:
        json.dump(report, f)

