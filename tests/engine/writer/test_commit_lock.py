"""The step's commit lock: a dead job's lock never blocks the job that owns the root now (found by
bench/bench_commit.py's kill -9 loop: the restarted job saved the same step again and got "another save is
committing this step" for commit_timeout_s), and a live committer's lock still excludes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ckptio.engine.writer.commit_point import CommitPoint
from ckptio.errors import CommitError, RootInUseError
from ckptio.format import step_dir
from ckptio.format.keys import COMMIT_LOCK
from ckptio.storage import PosixStorage
from ckptio.storage.base import join_key

STEP = 7


def _point(root: Path, claim: str, check_lease=lambda: None) -> CommitPoint:
    return CommitPoint("durable", PosixStorage(root, fsync=False), timeout_s=600, verify=False,
                       check_lease=check_lease, claim=claim)


def _held(root: Path, claim: str, save_id: int = 1) -> str:
    key = join_key(step_dir(STEP), COMMIT_LOCK)
    PosixStorage(root, fsync=False).put(key, json.dumps({"save_id": save_id, "time": time.time(),
                                                         "claim": claim}).encode())
    return key


def _lock_body(root: Path) -> dict:
    return json.loads((root / step_dir(STEP) / COMMIT_LOCK).read_bytes())


def test_a_young_lock_of_a_job_that_lost_the_root_is_taken_over_at_once(tmp_path: Path) -> None:
    _held(tmp_path, claim="killed-job", save_id=5)
    _point(tmp_path, claim="restarted-job")._lock(STEP, 1)
    assert _lock_body(tmp_path)["claim"] == "restarted-job"


def test_a_young_lock_of_another_save_excludes_with_ownership_off(tmp_path: Path) -> None:
    _held(tmp_path, claim="")
    with pytest.raises(CommitError, match="another save is committing"):
        _point(tmp_path, claim="")._lock(STEP, 2)
    assert _lock_body(tmp_path)["save_id"] == 1


def test_a_job_that_lost_the_root_never_breaks_the_owners_lock(tmp_path: Path) -> None:
    _held(tmp_path, claim="owner")

    def lost() -> None:
        raise RootInUseError("the root is owned by another job", root=str(tmp_path))

    with pytest.raises(RootInUseError):
        _point(tmp_path, claim="stale-job", check_lease=lost)._lock(STEP, 1)
    assert _lock_body(tmp_path)["claim"] == "owner"
