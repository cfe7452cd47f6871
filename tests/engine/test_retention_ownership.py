"""Retention keeps the newest committed steps and removes garbage; one job per root."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import ckptio
from ckptio import format as fmt
from ckptio.errors import RootInUseError
from ckptio.storage import PosixStorage


def _steps(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith("step-"))


def test_keep_last_keeps_the_newest_and_removes_uncommitted_leftovers(root):
    os.makedirs(os.path.join(root, "step-00000002"))  # a crashed attempt's leftover, older than what follows
    with open(os.path.join(root, "step-00000002", "__0_0.distcp"), "wb") as f:
        f.write(b"partial")
    os.makedirs(os.path.join(root, "step-00000099"))  # newer than every commit: may be in flight, kept
    state = {"w": torch.ones(8)}
    with ckptio.Checkpointer(root, keep_last=2) as ck:
        for step in (1, 3, 5, 7):
            ck.save(step, state).wait(timeout=120)
    # Retention runs after each commit is reported; close() waits for it.
    assert fmt.committed_steps(PosixStorage(root)) == [5, 7]
    assert _steps(root) == ["step-00000005", "step-00000007", "step-00000099"]


def test_keep_last_zero_keeps_everything(root):
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        for step in (1, 2, 3, 4):
            ck.save(step, {"w": torch.ones(8)})
        ck.wait()
    assert fmt.committed_steps(PosixStorage(root)) == [1, 2, 3, 4]


def test_retention_never_deletes_before_the_newer_step_is_committed(root):
    storage = PosixStorage(root)
    with ckptio.Checkpointer(root, keep_last=1) as ck:
        ck.save(1, {"w": torch.ones(8)}).wait(timeout=120)
    # Step 2 exists but is not committed: retention as of step 2 must not touch step 1.
    os.makedirs(os.path.join(root, "step-00000002", "ranks"))
    assert fmt.apply_retention(storage, keep_last=1, newest_committed=2) == []
    assert fmt.committed_steps(storage) == [1]


def test_a_fresh_drop_marker_keeps_its_uncommitted_step_until_it_is_old(root):
    storage = PosixStorage(root)
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        ck.save(6, {"w": torch.ones(8)}).wait(timeout=120)
    for step in (3, 4, 5):  # attempts that never committed, each with a rank's data file
        storage.put(f"{fmt.step_dir(step)}/__0_0.distcp", b"partial")
    fmt.write_failure(storage, 4, "rank2", 7, "rank 2 had no free staging slot", dropped=True)
    fmt.write_failure(storage, 5, "rank1", 8, "rank 1 had no free staging slot", dropped=True)
    old = os.path.join(root, fmt.step_dir(5), "failed", "rank1.json")
    with open(old) as f:
        body = json.load(f)
    with open(old, "w") as f:
        json.dump({**body, "time": body["time"] - 700}, f)
    fmt.apply_retention(storage, keep_last=0, newest_committed=6, markers_kept_s=600)
    # Step 3 (no marker) and step 5 (a marker older than the bound) go; step 4's marker is still to be read.
    assert _steps(root) == ["step-00000004", "step-00000006"]
    assert fmt.read_failure_markers(storage, 4, 7) == [("rank2: rank 2 had no free staging slot", True)]


def test_a_second_job_on_the_same_root_is_refused_until_the_first_closes(root):
    first = ckptio.Checkpointer(root)
    try:
        with pytest.raises(RootInUseError, match="owns this root"):
            ckptio.Checkpointer(root)
    finally:
        first.close()
    with ckptio.Checkpointer(root) as again:
        assert again.latest_step() is None


def test_a_dead_owner_frees_the_root_at_once(root):
    # A job that claims the root and exits without closing (like kill -9) leaves a stale owner record.
    code = f"import os, ckptio; ck = ckptio.Checkpointer({root!r}); os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert os.path.exists(os.path.join(root, ".ckptio-owner.json"))
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, {"w": torch.ones(2)}).wait(timeout=120)


def test_retention_records_the_committed_steps_it_deletes(root):
    # A rank whose watcher lags behind rank 0 reads this record to learn that its save committed before
    # retention removed it (keep_last=1 with saves faster than the watcher).
    from ckptio.format.retention import read_retired

    with ckptio.Checkpointer(root, keep_last=1) as ck:
        handles = [ck.save(step, {"w": torch.full((8,), float(step))}) for step in (1, 2, 3)]
        for h in handles:
            h.wait(timeout=120)
    retired = read_retired(PosixStorage(root))
    assert {step: retired.get(step) for step in (1, 2)} == {1: handles[0].save_id, 2: handles[1].save_id}
    assert 3 not in retired
