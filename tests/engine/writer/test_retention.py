"""Retention and leftover cleanup on the writer side, in one process (formerly Checkpointer-driven tests in
tests/engine/test_retention_ownership.py): keep_last keeps the newest committed steps and records the ones it
deletes; leftovers of crashed attempts below the newest commit go at the writer's start and close, those above it
and fresh drop markers stay."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ckptio import format as fmt
from ckptio.engine.protocol import SaveDone
from ckptio.engine.writer.pipeline import Writer
from ckptio.format.retention import read_retired, remove_leftovers, retain
from ckptio.storage import PosixStorage
from tests.engine.writer.harness import Inbox, plan_ranks, run, save_job, state, writer_start


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))


def _save_steps(root: Path, tmp_path: Path, steps: list[int], **options: object) -> list[int]:
    inbox = Inbox()
    writer = Writer(writer_start(str(root), **options), inbox.outbox(0))
    s = state(1)
    (rank0,) = plan_ranks([s])
    writer.add_plan(rank0.plan)
    try:
        for step in steps:
            run(writer, save_job(rank0, s, tmp_path / "slot", step=step, save_id=100 + step))
            assert isinstance(inbox.outcome(100 + step), SaveDone)
    finally:
        writer.close()  # its last cleanup and leftover sweep
    return [100 + step for step in steps]


def test_keep_last_keeps_the_newest_and_the_sweeps_remove_leftovers_below_them(root, tmp_path):
    crashed = root / "step-00000002"
    (crashed / "ranks").mkdir(parents=True)  # a crashed attempt's leftover, older than what follows
    (crashed / "__0_0-0000000000001.distcp").write_bytes(b"partial")
    (crashed / "ranks" / "0.json").write_text("{}")
    (root / "step-00000099").mkdir()  # newer than every commit: may be in flight, kept
    _save_steps(root, tmp_path, [1, 3, 5, 7], keep_last=2)
    assert fmt.committed_steps(PosixStorage(str(root))) == [5, 7]
    assert _steps(root) == ["step-00000005", "step-00000007", "step-00000099"]


def test_keep_last_zero_keeps_everything(root, tmp_path):
    _save_steps(root, tmp_path, [1, 2, 3, 4], keep_last=0)
    assert fmt.committed_steps(PosixStorage(str(root))) == [1, 2, 3, 4]


def test_retention_records_the_committed_steps_it_deletes(root, tmp_path):
    # A rank whose watcher lags behind rank 0 reads this record to learn that its save committed before
    # retention removed it (keep_last=1 with saves faster than the watcher).
    save_ids = _save_steps(root, tmp_path, [1, 2, 3], keep_last=1)
    retired = read_retired(PosixStorage(str(root)))
    assert {step: retired.get(step) for step in (1, 2)} == {1: save_ids[0], 2: save_ids[1]}
    assert 3 not in retired


def _commit(storage: PosixStorage, step: int) -> None:
    fmt.write_manifest(storage, fmt.Manifest(step=step, world_size=1, save_id=step, files={}, total_bytes=0))


def test_retention_never_deletes_before_the_newer_step_is_committed(root):
    storage = PosixStorage(str(root))
    _commit(storage, 1)
    (root / "step-00000002" / "ranks").mkdir(parents=True)  # step 2 exists but is not committed
    assert retain(storage, committed=[1], keep_last=1, newest_committed=2) == []
    assert fmt.apply_retention(storage, keep_last=1, newest_committed=2) == []
    assert fmt.committed_steps(storage) == [1]


def test_a_fresh_drop_marker_keeps_its_uncommitted_step_until_it_is_old(root):
    storage = PosixStorage(str(root))
    _commit(storage, 6)
    for step in (3, 4, 5):  # attempts that never committed, each with a rank's data file
        storage.put(f"{fmt.step_dir(step)}/__0_0-0000000000007.distcp", b"partial")
    fmt.write_failure(storage, 4, "rank2", 7, "rank 2 had no free staging slot", dropped=True)
    fmt.write_failure(storage, 5, "rank1", 8, "rank 1 had no free staging slot", dropped=True)
    old = root / fmt.step_dir(5) / "failed" / "rank1.json"
    body = json.loads(old.read_text())
    old.write_text(json.dumps({**body, "time": time.time() - 700}))
    assert remove_leftovers(storage, below=6, committed={6}, markers_kept_s=600) == [3, 5]
    # Step 3 (no marker) and step 5 (a marker older than the bound) go; step 4's marker is still to be read.
    assert _steps(root) == ["step-00000004", "step-00000006"]
    assert fmt.read_failure_markers(storage, 4, 7) == [("rank2: rank 2 had no free staging slot", True)]


def test_retiring_an_abandoned_step_keeps_a_fresh_marker_of_the_new_attempt_at_it(root, tmp_path):
    """(Formerly tests/engine/test_steps.py's, with a whole Checkpointer.) The resumed run's attempt at step 15 was
    dropped by a rank; a lagging rank still has to read that marker when the rollback retires the old step 15."""
    from ckptio.format.rollback import retire_abandoned

    _save_steps(root, tmp_path, [5, 10, 15, 20, 25], keep_last=0)
    storage = PosixStorage(str(root))
    fmt.write_failure(storage, 15, "rank1", 99, "rank 1 had no free staging slot", dropped=True)
    retired = retire_abandoned(storage, above=10, keep=20, own_save_ids=(), live=(), markers_kept_s=600)
    assert retired == [15, 25]
    assert fmt.committed_steps(storage) == [5, 10, 20]
    assert fmt.read_failure_markers(storage, 15, 99) == [("rank1: rank 1 had no free staging slot", True)]
    assert not (root / fmt.step_dir(25)).exists()
    assert not list((root / fmt.step_dir(15)).glob("*.distcp"))
