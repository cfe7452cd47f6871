"""Full disks (issue 09, item 5): a failed attempt leaves nothing behind, and a full local tier never wedges saves.

ENOSPC comes from ``ckptio.testing.wrappers.FaultStorage`` over real directories: it refuses a write once the
directory's real contents would exceed a byte capacity. It stands in for a small tmpfs or loop device, which this
test machine cannot mount; space is "freed" by deleting a real ballast file from the directory.
"""

from __future__ import annotations

import json
import os

import torch

import ckptio
from ckptio import format as fmt
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import FaultStorage

MiB = 1 << 20


def _data_files(top: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), top) for d, _, names in os.walk(top) for n in names
                  if n.endswith(".distcp"))


def _ballast(directory: str, nbytes: int) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "ballast")
    with open(path, "wb") as f:
        f.write(b"\0" * nbytes)
    return path


def test_a_failed_attempt_is_removed_from_both_tiers_and_the_next_save_succeeds(tmp_path):
    root, local = str(tmp_path / "ckpt"), str(tmp_path / "local")
    ballast = _ballast(root, 3 * MiB)
    durable = FaultStorage(PosixStorage(root), capacity_bytes=6 * MiB)
    state = {"w": torch.randn(1024, 1024)}  # 4 MiB in four 1 MiB files: two or three fit, then ENOSPC
    # One upload at a time, so the capacity check of each file sees the bytes of the ones before it.
    with ckptio.Checkpointer(durable, local_dir=local, file_size_bytes=MiB, upload_concurrency=1) as ck:
        h = ck.save(1, state)
        try:
            h.wait(timeout=120)
        except ckptio.errors.StorageFullError:
            pass
        assert h.error is not None
        assert _data_files(root) == [], "the failed attempt's uploads were left on the durable tier"
        assert _data_files(local) == [], "the failed attempt's files were left on the local tier"
        os.unlink(ballast)  # space frees
        ck.save(2, state).wait(timeout=120)
        target = {"w": torch.zeros(1024, 1024)}
        assert ck.restore(target) == 2
    assert torch.equal(target["w"], state["w"])


def test_a_full_local_tier_evicts_then_writes_durable_only_and_later_saves_keep_working(tmp_path):
    root, local_dir, events = str(tmp_path / "ckpt"), str(tmp_path / "local"), str(tmp_path / "ev.jsonl")
    os.makedirs(local_dir)
    local = FaultStorage(PosixStorage(local_dir, fsync=False), capacity_bytes=6 * MiB)  # no local_capacity_bytes
    states = {s: {"w": torch.full((1024, 1024), float(s))} for s in (1, 2, 3, 4)}  # 4 MiB each
    with ckptio.Checkpointer(root, local_dir=local, keep_last=0, upload_concurrency=1, events_path=events) as ck:
        ck.save(1, states[1]).wait(timeout=120)
        ck.save(2, states[2]).wait(timeout=120)  # 4 + 4 > 6 MiB: the committed step 1 is evicted to make room
        assert sorted(os.listdir(local_dir)) == ["step-00000002"]
        _ballast(local_dir, 5 * MiB)  # now nothing evictable frees enough
        ck.save(3, states[3]).wait(timeout=120)  # durable only, with a warning event
        ck.save(4, states[4]).wait(timeout=120)
        target = {"w": torch.zeros(1024, 1024)}
        assert ck.restore(target, step=3) == 3
        assert torch.equal(target["w"], states[3]["w"])
    assert fmt.committed_steps(PosixStorage(root)) == [1, 2, 3, 4]
    with open(str(tmp_path / "ev.rank0.jsonl")) as f:
        full = [r for r in map(json.loads, f) if r["event"] == "local_tier_full"]
    assert {r["step"] for r in full} == {3, 4}
    assert _data_files(local_dir) == []  # the refused attempts left nothing on the local tier
