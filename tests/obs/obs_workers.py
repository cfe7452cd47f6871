"""Rank bodies for the end-to-end observability test (spawned by torch.multiprocessing)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from prometheus_client import CollectorRegistry, generate_latest

import ckptio
from ckptio.obs.steps import StepTimer
from ckptio.storage.posix import PosixStorage
from ckptio.storage.wrappers import LatencyStorage

SAVE_STEPS = (2, 3, 7)
"""Step 3 comes milliseconds after step 2, while step 2 is still flushing: with one slot, it is skipped."""
STEPS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(world_size: int, fn: Callable[..., Any], *args: Any) -> None:
    mp.spawn(_entry, args=(world_size, _free_port(), fn, args), nprocs=world_size, join=True)


def train_with_checkpoints(rank: int, world_size: int, root: str, events_path: str, out_dir: str) -> None:
    """A small training loop: timed steps, three saves (one while the store is still busy), metrics dumped."""
    registry = CollectorRegistry()
    # Every storage operation takes 0.2 s: a flush spans several of them, far longer than a step.
    storage = LatencyStorage(PosixStorage(root, fsync=False), seconds=0.2)
    state = {"w": torch.zeros(256, 256), "b": torch.zeros(256)}
    handles = {}
    with ckptio.Checkpointer(
        root=storage,
        events_path=events_path,
        max_pending=1,
        overflow="skip",
        keep_last=0,
        metrics_registry=registry,
    ) as ck:
        timer = StepTimer(ck.events)
        for step in range(1, STEPS + 1):
            with timer.step(step):
                state["w"].add_(1.0)
                dist.all_reduce(state["b"])
                time.sleep(0.01)
                if step in SAVE_STEPS:
                    handles[step] = ck.save(step, state)
            if step == 5:
                ck.wait()
        ck.wait()
    skipped = sorted(step for step, h in handles.items() if h.skipped)
    with open(os.path.join(out_dir, f"metrics{rank}.txt"), "wb") as fh:
        fh.write(generate_latest(registry))
    with open(os.path.join(out_dir, f"skipped{rank}.txt"), "w") as fh:
        fh.write(",".join(map(str, skipped)))
