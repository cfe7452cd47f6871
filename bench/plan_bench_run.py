"""A small real ckptio job for the planner and simulator benchmarks: N gloo ranks saving every interval.

Each rank sleeps ``interval_s`` (its "compute"), saves a state of ``bytes_per_rank`` through a Checkpointer
(block on a full slot), and logs events; the figures come back per save as the slowest rank saw them. The
store is a directory, optionally behind a shared :class:`~ckptio.testing.wrappers.ThrottledStorage` budget.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_TENSORS_PER_RANK = 4
_PHASES = ("serialize", "upload", "manifest", "retention")
_FIGURES = ("blocking_s", "flush_s", "commit_s", "data_s", "lag_s", *_PHASES)


@dataclass(kw_only=True, slots=True)
class RunSpec:
    """The measured job."""

    ranks: int
    """gloo ranks."""
    bytes_per_rank: int
    """State bytes each rank saves."""
    saves: int
    """Timed saves (after one warm-up save that starts the writers)."""
    interval_s: float
    """Sleep ("compute") before each save."""
    root: str
    """Checkpoint directory."""
    events_dir: str
    """Where the per-rank event logs go."""
    throttle_bytes_per_s: float | None = None
    """Aggregate write budget of the store, shared by every writer; None writes at disk speed."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, spec: RunSpec, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=spec.ranks)
    try:
        _train(rank, spec)
    finally:
        dist.destroy_process_group()


def _train(rank: int, spec: RunSpec) -> None:
    from ckptio import Checkpointer
    from ckptio.storage import PosixStorage
    from ckptio.testing.wrappers import ThrottledStorage

    root: Any = spec.root
    if spec.throttle_bytes_per_s:
        throttle_state = os.path.join(spec.events_dir, "throttle.state")
        root = ThrottledStorage(PosixStorage(spec.root), write_bytes_per_s=spec.throttle_bytes_per_s,
                                state_path=throttle_state)
    numel = spec.bytes_per_rank // 4 // _TENSORS_PER_RANK
    # Keys of their own per rank: plain tensors under one key would count as replicated, and DCP would
    # spread them over the ranks instead of having each rank write its own bytes.
    state = {f"r{rank}.t{i}": torch.full((numel,), float(rank + i)) for i in range(_TENSORS_PER_RANK)}
    events = os.path.join(spec.events_dir, "events.rank{rank}.jsonl")
    with Checkpointer(root=root, events_path=events, max_pending=1, overflow="block", keep_last=2) as ck:
        ck.save(0, state).wait()  # warm-up: writer booted, buffers allocated, plan cached
        dist.barrier()
        for index in range(1, spec.saves + 1):
            time.sleep(spec.interval_s)
            ck.save(index, state)
        ck.wait()


def run_job(spec: RunSpec) -> list[dict[str, float]]:
    """Run ``spec`` and return one dict of figures per timed save (see :func:`per_save_figures`)."""
    os.makedirs(spec.events_dir, exist_ok=True)
    if spec.throttle_bytes_per_s:
        open(os.path.join(spec.events_dir, "throttle.state"), "wb").close()
    mp.spawn(_rank_main, args=(spec, _free_port()), nprocs=spec.ranks, join=True)
    return per_save_figures(spec.events_dir, spec.ranks)


def per_save_figures(events_dir: str, ranks: int) -> list[dict[str, float]]:
    """Per save, from the ranks' events (one host: monotonic clocks agree across processes):

    ``blocking_s`` (slowest rank), ``flush_s`` (slowest rank's ``committed.flush_s``, as ckptio reports it),
    ``commit_s`` (last ``save()`` return → the manifest written: the commit itself), ``data_s`` (last
    ``save()`` return → the last data file durable), ``lag_s``, and the writer phases ``serialize``,
    ``upload``, ``retention`` (summed over a rank's files, slowest rank).
    """
    saves: dict[int, dict[str, float]] = {}
    returned: dict[int, float] = {}
    committed_at: dict[int, float] = {}
    data_at: dict[int, float] = {}
    phases: dict[tuple[int, int, str], float] = {}
    for rank in range(ranks):
        with open(os.path.join(events_dir, f"events.rank{rank}.jsonl"), encoding="utf-8") as f:
            for event in map(json.loads, f):
                step, name = event.get("step"), event["event"]
                if not step:
                    continue
                slot = saves.setdefault(step, dict.fromkeys(_FIGURES, 0.0))
                if name == "phase" and event.get("phase") in _PHASES:
                    key = (rank, step, event["phase"])
                    phases[key] = phases.get(key, 0.0) + event["seconds"]
                    if event["phase"] == "manifest":
                        committed_at[step] = event["mono"]
                    elif event["phase"] == "upload":
                        data_at[step] = max(data_at.get(step, 0.0), event["mono"])
                elif name == "save_returned":
                    slot["blocking_s"] = max(slot["blocking_s"], event["blocking_s"])
                    returned[step] = max(returned.get(step, 0.0), event["mono"])
                elif name == "committed" and event.get("role") == "trainer":
                    slot["flush_s"] = max(slot["flush_s"], event["flush_s"])
                    slot["lag_s"] = max(slot["lag_s"], event.get("lag_s") or 0.0)
    for (_, step, phase), seconds in phases.items():
        saves[step][phase] = max(saves[step][phase], seconds)
    for step, at in committed_at.items():
        saves[step]["commit_s"] = at - returned[step]
    for step, at in data_at.items():
        saves[step]["data_s"] = at - returned[step]
    return [saves[s] for s in sorted(saves)]


def median(saves: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in saves)


def copy_bytes_per_s(nbytes: int = 256 << 20) -> float:
    """The "device-to-host" copy of a CPU job: a copy into a preallocated buffer (best of three)."""
    source = torch.ones(nbytes // 4)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - began)
    return nbytes / best
