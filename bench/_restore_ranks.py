"""The multi-rank halves of ``bench_restore.py``: save a state on N gloo ranks, restore it on M, and count the bytes
each rank read from the store.

Each rank counts two ways: ``/proc/self/io`` ``rchar`` around the restore (the bytes its read system calls
returned: files, and sockets read with ``read``), and a :class:`~ckptio.testing.wrappers.CountingStorage` around the
store (the bytes the store served ckptio). gloo receives with ``recvmsg``, which ``rchar`` does not count (checked
here with a 64 MiB send: ``socket_rchar`` in the output), so the ranges ranks send each other are not counted as
store reads. DCP's own reader (``dcp.load``) is counted with ``rchar`` only.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

MiB = 1 << 20


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def replicated_state(mib: int, tensors: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.rand(mib * MiB // 4 // tensors, generator=g) for i in range(tensors)}


def sharded_state(mib: int, tensors: int, seed: int) -> dict[str, Any]:
    """FSDP2's layout: every parameter a DTensor sharded on dim 0 over all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(seed)
    rows = 4096
    cols = mib * MiB // 4 // tensors // rows
    return {f"layer.{i}": distribute_tensor(torch.rand(rows, cols, generator=g), mesh, [Shard(0)])
            for i in range(tensors)}


def _make(kind: str, mib: int, tensors: int, seed: int) -> dict[str, Any]:
    return (replicated_state if kind == "replicated" else sharded_state)(mib, tensors, seed)


def _local_bytes(state: dict[str, Any]) -> int:
    return sum((v.to_local() if hasattr(v, "to_local") else v).nbytes for v in state.values())


def save(rank: int, world: int, spec: dict[str, Any]) -> None:
    """``spec``: root, kind ("replicated" or "sharded"), mib, tensors."""
    import ckptio

    with ckptio.Checkpointer(spec["root"]) as ck:
        ck.save(1, _make(spec["kind"], spec["mib"], spec["tensors"], seed=1)).wait(timeout=600)


def socket_rchar() -> int:
    """rchar counted on rank 1 while it receives 64 MiB over gloo (0: socket receives are not store reads)."""
    group = dist.new_group(backend="gloo")
    t = torch.zeros(64 * MiB, dtype=torch.uint8)
    before = rchar()
    if dist.get_rank() == 0:
        dist.send(t, dst=1, group=group)
    elif dist.get_rank() == 1:
        dist.recv(t, src=0, group=group)
    return rchar() - before


def restore(rank: int, world: int, spec: dict[str, Any]) -> None:
    """Restore with ckptio (store bytes counted both ways) and with plain dcp.load of the same checkpoint.
    ``spec``: as :func:`save`'s, and ``out``, the directory for each rank's JSON figures."""
    from ckptio.engine.restore.context import RestoreContext
    from ckptio.engine.restore.step_restore import restore_step
    from ckptio.engine.side_group import SideGroup
    from ckptio.storage import open_storage
    from ckptio.testing.wrappers import CountingStorage

    root, kind, mib, tensors, out = (spec[k] for k in ("root", "kind", "mib", "tensors", "out"))
    sock = socket_rchar() if world > 1 else 0
    group = SideGroup()
    state = _make(kind, mib, tensors, seed=0)
    counting = CountingStorage(open_storage(root))
    dist.barrier()
    before, t0 = rchar(), time.perf_counter()
    restore_step(RestoreContext(counting, group), state)
    ck_s, ck_rchar = time.perf_counter() - t0, rchar() - before
    ok = all(torch.equal(a.full_tensor() if hasattr(a, "full_tensor") else a,
                         b.full_tensor() if hasattr(b, "full_tensor") else b)
             for a, b in zip(state.values(), _make(kind, mib, tensors, seed=1).values(), strict=True))
    store = sum(n for key, n in counting.bytes_read.items() if key.endswith(".distcp"))
    state = _make(kind, mib, tensors, seed=0)
    dist.barrier()
    before = rchar()
    dcp.load(state, checkpoint_id=os.path.join(root, "step-00000001"))
    dcp_rchar = rchar() - before
    with open(os.path.join(out, f"{kind}-{world}-{rank}.json"), "w") as f:
        json.dump({"ok": ok, "ckptio_store_bytes": store, "ckptio_rchar": ck_rchar, "dcp_rchar": dcp_rchar,
                   "needed": _local_bytes(state), "socket_rchar": sock, "seconds": ck_s}, f)
