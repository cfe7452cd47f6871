"""No collective on the steady save path, and still one outcome per step on every rank.

Real gloo ranks on a throttled store keep the staging slots busy; each rank decides alone whether to stage, and a
rank that cannot leaves a drop marker, so the others' saves of that step complete as dropped. A step is committed
on every rank or on none.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import pytest
import torch

import ckptio
from ckptio.obs.eventfiles import load_events
from ckptio.obs.events import rank_path
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import GatedReadStorage, ThrottledStorage
from tests.engine.engine_workers import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _outcomes(handles: dict[int, ckptio.SaveHandle]) -> dict[str, list[int]]:
    return {
        "skipped": sorted(s for s, h in handles.items() if h.skipped),
        "dropped": sorted(s for s, h in handles.items() if h.dropped),
        "committed": sorted(s for s, h in handles.items() if not h.skipped and h.error is None),
        "failed": sorted(s for s, h in handles.items() if h.error is not None),
    }


def _random_delays(rank: int, world_size: int, root: str, state_path: str, out: str) -> None:
    store = ThrottledStorage(PosixStorage(root, fsync=False), write_bytes_per_s=6 << 20, state_path=state_path)
    rng = random.Random(1000 + rank)
    handles = {}
    with ckptio.Checkpointer(store, max_pending=1, overflow="skip", keep_last=0) as ck:
        for step in range(1, 16):
            time.sleep(rng.random() * 0.4)  # per-rank skew: no barrier, no collective between saves
            # A key per rank: replicated keys are written by one rank only (DCP's dedup), these by every rank.
            handles[step] = ck.save(step, {f"w{rank}": torch.full((512, 1024), float(step + rank))})
            ck.wait_staged()
        ck.wait()
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(_outcomes(handles), f)


def _results(out: str, n: int, prefix: str = "") -> list[Any]:
    """Each rank's JSON result file, in rank order."""
    results = []
    for r in range(n):
        with open(os.path.join(out, f"{prefix}{r}.json")) as f:
            results.append(json.load(f))
    return results


def _committed_on_disk(root: str) -> list[int]:
    return sorted(int(n.split("-")[1]) for n in os.listdir(root)
                  if n.startswith("step-") and os.path.exists(os.path.join(root, n, "manifest.json")))


def test_skip_outcomes_are_identical_on_three_ranks_with_random_delays(tmp_path):
    root, out = str(tmp_path / "ckpt"), str(tmp_path)
    os.makedirs(root)
    run_ranks(3, _random_delays, root, str(tmp_path / "throttle"), out)
    results = _results(out, 3)
    assert all(r["failed"] == [] for r in results), results
    assert all(r["skipped"] == results[0]["skipped"] for r in results), f"ranks disagreed: {results}"
    assert all(r["committed"] == results[0]["committed"] for r in results), f"ranks disagreed: {results}"
    assert results[0]["skipped"], "the throttled store should have forced skips"
    assert results[0]["committed"], results
    assert _committed_on_disk(root) == results[0]["committed"]


def _one_slow_rank(rank: int, world_size: int, root: str, base: str) -> None:
    state_path, events, out = os.path.join(base, "throttle"), os.path.join(base, "events.jsonl"), base
    inner = PosixStorage(root, fsync=False)
    # Rank 1's store is slow: its slot is still busy at step 2 while rank 0's is free.
    store = ThrottledStorage(inner, write_bytes_per_s=64 << 10, state_path=state_path) if rank == 1 else inner
    handles = {}
    with ckptio.Checkpointer(store, max_pending=1, overflow="skip", keep_last=0, events_path=events) as ck:
        assert ck.writer_ready(timeout=120)
        state = {f"w{rank}": torch.ones(128, 1024)}  # 512 KiB of this rank's own: about 8 s on rank 1's store
        handles[1] = ck.save(1, state)
        if rank == 0:
            assert ck._staging.wait_free(timeout=120)  # rank 0's writer freed its slot (the data is written)
        torch.distributed.barrier()
        handles[2] = ck.save(2, state)
        ck.wait()
        handles[3] = ck.save(3, state)
        ck.wait()
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump({**_outcomes(handles), "reason2": handles[2].skip_reason}, f)


def test_a_step_one_rank_cannot_stage_is_dropped_on_every_rank_and_never_committed(tmp_path):
    root, out, events = str(tmp_path / "ckpt"), str(tmp_path), str(tmp_path / "events.jsonl")
    os.makedirs(root)
    run_ranks(2, _one_slow_rank, root, out)
    results = _results(out, 2)
    assert results[1]["skipped"] == [2] and results[1]["dropped"] == [], results  # rank 1 skipped at once
    assert results[0]["skipped"] == [2] and results[0]["dropped"] == [2]  # rank 0 staged it, then it was dropped
    assert "rank 1 had no free staging slot" in results[0]["reason2"]
    assert all(r["committed"] == [1, 3] for r in results)
    assert _committed_on_disk(root) == [1, 3]
    # Nothing of the dropped attempt stays behind: rank 0's data files of step 2 were deleted.
    step2 = os.path.join(root, "step-00000002")
    assert not os.path.exists(step2) or not [n for n in os.listdir(step2) if n.endswith(".distcp")]
    for r in range(2):
        skipped = [e for e in load_events(rank_path(events, r)) if e["event"] == "save_skipped"]
        assert [e["step"] for e in skipped] == [2], r


def _lagging_watcher(rank: int, world_size: int, root: str, base: str) -> None:
    inner = PosixStorage(root, fsync=False)
    if rank == 0:  # its step 1 takes seconds to write, so its slot is still busy at step 2: rank 0 drops step 2
        store: Any = ThrottledStorage(inner, write_bytes_per_s=64 << 10, state_path=os.path.join(base, "throttle"))
    else:  # rank 1's watcher cannot read step 1's manifest until rank 0 has committed step 3 (and cleaned up)
        store = GatedReadStorage(inner, key_with="step-00000001/manifest", until_key="step-00000003/manifest.json")
    handles = {}
    # Rank 1 writes step 3 while its watches of steps 1 and 2 are still open (the gate holds the first until step 3
    # commits): its writer's back-pressure allows max_pending unfinished commits, so rank 1 needs 2.
    with ckptio.Checkpointer(store, max_pending=1 + rank, overflow="skip", keep_last=0, commit_timeout_s=30) as ck:
        assert ck.writer_ready(timeout=120)
        state = {f"w{rank}": torch.ones(64, 1024)}  # 256 KiB: about 4 s on rank 0's store
        handles[1] = ck.save(1, state)
        if rank == 1:
            assert ck._staging.wait_free(timeout=120)
        torch.distributed.barrier()
        handles[2] = ck.save(2, state)  # rank 0: no free slot, a drop marker; rank 1 stages and writes it
        assert ck._staging.wait_free(timeout=120)
        torch.distributed.barrier()
        handles[3] = ck.save(3, state)
        ck.wait()
    with open(os.path.join(base, f"{rank}.json"), "w") as f:
        json.dump(_outcomes(handles), f)


def test_a_drop_marker_outlives_the_next_commit_for_a_rank_that_reads_it_late(tmp_path):
    # Rank 1 learns that step 2 was dropped only from rank 0's marker, and reads it after rank 0 committed step 3.
    # Retention after that commit used to delete step 2's directory, marker included: rank 1 then waited
    # commit_timeout_s for a manifest that never came and reported the dropped save as failed.
    root, out = str(tmp_path / "ckpt"), str(tmp_path)
    os.makedirs(root)
    run_ranks(2, _lagging_watcher, root, out)
    results = _results(out, 2)
    assert all(r["failed"] == [] for r in results), results
    assert all(r["skipped"] == [2] and r["committed"] == [1, 3] for r in results), results
    assert results[1]["dropped"] == [2], results
    assert _committed_on_disk(root) == [1, 3]


def _time_based(rank: int, world_size: int, root: str, out: str) -> None:
    # Each rank's clock and pace differ (rank 0's decides); maybe_save runs no blocking collective, yet every rank
    # must save the same steps.
    rng = random.Random(7 + rank)
    saved = []
    with ckptio.Checkpointer(PosixStorage(root, fsync=False), every_seconds=0.3, keep_last=0) as ck:
        for step in range(1, 41):
            time.sleep(rng.random() * 0.05)
            if ck.maybe_save(step, {f"w{rank}": torch.full((64,), float(step))}) is not None:
                saved.append(step)
        ck.wait()
    with open(os.path.join(out, f"time-{rank}.json"), "w") as f:
        json.dump(saved, f)


def test_every_seconds_saves_the_same_steps_on_every_rank(tmp_path):
    root, out = str(tmp_path / "ckpt"), str(tmp_path)
    os.makedirs(root)
    run_ranks(3, _time_based, root, out)
    saved = _results(out, 3, "time-")
    assert saved[0] == saved[1] == saved[2], saved
    assert len(saved[0]) >= 2, saved  # 40 steps of ~25 ms + work against a 0.3 s interval
    assert _committed_on_disk(root) == saved[0]
