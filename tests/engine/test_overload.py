"""overflow="skip" on a throttled store: every rank ends with the same skipped steps, memory stays bounded."""

from __future__ import annotations

import json
import os

import pytest
import torch

import ckptio
from ckptio.engine.trainer.staging_area import SHM_DIR, SLOT_PREFIX
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import ThrottledStorage
from tests.engine.engine_workers import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _saver(rank: int, world_size: int, root: str, state_path: str, out: str) -> None:
    store = ThrottledStorage(PosixStorage(root), write_bytes_per_s=8 << 20, state_path=state_path)
    handles, max_slots = {}, 0
    with ckptio.Checkpointer(store, max_pending=1, overflow="skip", keep_last=0) as ck:
        for step in range(1, 13):
            state = {"w": torch.full((512, 1024), float(step))}  # 2 MiB per rank, ~0.5 s of store time each
            handles[step] = ck.save(step, state)
            ck.wait_staged()
            slots = [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SLOT_PREFIX}{os.getpid()}-")]
            max_slots = max(max_slots, len(slots))
            torch.distributed.barrier()
        ck.wait()
        latest = ck.latest_step()
    # A rank with a busy slot skips at once; the others learn it from its drop marker and their save is dropped.
    skipped = [step for step, h in handles.items() if h.skipped]
    saved = [step for step, h in handles.items() if not h.skipped]
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump({"skipped": skipped, "saved": saved, "latest": latest, "max_slots": max_slots}, f)


def test_skips_are_agreed_on_every_rank_and_memory_is_bounded(tmp_path):
    root = str(tmp_path / "ckpt")
    state_path = str(tmp_path / "throttle")
    out = str(tmp_path)
    run_ranks(2, _saver, root, state_path, out)
    results = []
    for r in range(2):
        with open(os.path.join(out, f"{r}.json")) as f:
            results.append(json.load(f))
    assert results[0]["skipped"] == results[1]["skipped"], "ranks disagreed on which saves to skip"
    assert results[0]["skipped"], "the throttled store should have forced skips"
    assert results[0]["saved"]
    assert all(r["latest"] == results[0]["saved"][-1] for r in results)
    assert all(r["max_slots"] <= 1 for r in results), "more staging slots than max_pending"
    committed = sorted(int(n.split("-")[1]) for n in os.listdir(root)
                       if n.startswith("step-") and os.path.exists(os.path.join(root, n, "manifest.json")))
    assert committed == results[0]["saved"]
