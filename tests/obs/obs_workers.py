"""Rank bodies for the end-to-end observability test (spawned by torch.multiprocessing)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry, generate_latest

import ckptio
from ckptio.obs.steps import StepTimer
from ckptio.storage.posix.posix_storage import PosixStorage
from ckptio.testing.wrappers import LatencyStorage

SAVE_STEPS = (2, 3, 7)
"""Step 3 comes milliseconds after step 2, while step 2 is still flushing: with one slot, it is skipped."""
STEPS = 8


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
