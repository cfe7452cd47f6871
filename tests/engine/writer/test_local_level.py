"""The local level in one process: two writers on two "nodes" with real partner servers on 127.0.0.1. A
local-level save commits in the local level's records with a copy on the partner node; a failure on one rank's
local level ends every rank's save at once, its marker in the local level's records only; a full local tier
fails the local level of a two-level save while the durable one commits."""

from __future__ import annotations

import errno
import time
from pathlib import Path

from ckptio.engine.protocol import JobLevels, SaveDone, SaveFailed
from ckptio.engine.writer.pipeline import Writer
from ckptio.format import committed_steps, read_manifest
from ckptio.format.local_level_records import local_records
from ckptio.storage import open_storage
from ckptio.testing.wrappers import FaultStorage
from tests.engine.writer.harness import Inbox, eventually, plan_ranks, run, save_job, state, two_level_starts

LOCAL = JobLevels(durable=False, local=True)
BOTH = JobLevels(durable=True, local=True)


def _run(writers: list[Writer], starts, tmp_path: Path, *, step: int, save_id: int, levels: JobLevels,
         skip_plan_of: int | None = None) -> list[Inbox]:
    states = [state(10 + r, keys=(f"r{r}",)) for r in range(len(starts))]
    plans = plan_ranks(states)
    inboxes = [Inbox() for _ in starts]
    ws = [Writer(start, inboxes[r].outbox(r)) for r, start in enumerate(starts)]
    writers.extend(ws)
    for r in reversed(range(len(ws))):
        if r != skip_plan_of:
            ws[r].add_plan(plans[r].plan)
        run(ws[r], save_job(plans[r], states[r], tmp_path / f"slot{r}", step=step, save_id=save_id,
                               levels=levels))
    return inboxes


def test_a_local_level_save_commits_in_the_local_records_with_a_copy_on_the_partner_node(root, tmp_path, writers):
    starts = two_level_starts(root, tmp_path)
    inboxes = _run(writers, starts, tmp_path, step=3, save_id=1, levels=LOCAL)
    assert all(isinstance(ib.outcome(1), SaveDone) for ib in inboxes)
    records = local_records(open_storage(str(root)))
    manifest = read_manifest(records, 3)
    assert {rec.holders[0] for rec in manifest.files.values()} == {"n0", "n1"}
    assert all(len(rec.holders) == 2 and rec.digest for rec in manifest.files.values())
    assert committed_steps(open_storage(str(root))) == []  # nothing on the durable level
    name = next(n for n in manifest.files if n.startswith("__0_"))
    mine, copy = tmp_path / "local0" / "step-00000003" / name, tmp_path / "local1" / "partners" / "step-00000003" / name
    assert mine.read_bytes() == copy.read_bytes()
    assert [e["level"] for e in inboxes[1].events("level_committed")] == ["local"]


def test_a_failure_on_one_ranks_local_level_ends_every_ranks_save_with_a_local_marker_only(root, tmp_path, writers):
    starts = two_level_starts(root, tmp_path, commit_timeout_s=60.0)
    t0 = time.monotonic()
    inboxes = _run(writers, starts, tmp_path, step=5, save_id=2, levels=LOCAL, skip_plan_of=1)
    assert all(isinstance(ib.outcome(2), SaveFailed) for ib in inboxes)
    assert time.monotonic() - t0 < 30  # rank 0 read rank 1's marker; it did not wait commit_timeout_s
    local_markers = root / "levels" / "local" / "step-00000005" / "failed"
    assert [p.name for p in local_markers.iterdir()] == ["rank1.json"]
    assert not (root / "step-00000005").exists()  # the durable records: this save never went there
    assert [e["level"] for e in inboxes[0].events("level_failed")] == ["local"]
    assert not list((tmp_path / "local0" / "step-00000005").glob("*.distcp"))  # rank 0's files discarded


def test_a_full_local_tier_fails_the_local_level_only_and_the_durable_level_commits(root, tmp_path, writers):
    def full_on_rank1(rank: int, path: Path):
        storage = open_storage(str(path), fsync=False)
        return FaultStorage(storage, errno_code=errno.ENOSPC, fail_keys_with=".distcp") if rank == 1 else storage

    starts = two_level_starts(root, tmp_path, local_storage=full_on_rank1, commit_timeout_s=60.0)
    t0 = time.monotonic()
    inboxes = _run(writers, starts, tmp_path, step=6, save_id=3, levels=BOTH)
    assert all(isinstance(ib.outcome(3), SaveDone) for ib in inboxes)  # the durable level decides the save
    assert read_manifest(open_storage(str(root)), 6).save_id == 3
    eventually(lambda: inboxes[0].events("level_failed"))
    assert time.monotonic() - t0 < 30
    assert inboxes[1].events("local_tier_full")
    assert [p.name for p in (root / "levels" / "local" / "step-00000006" / "failed").iterdir()] == ["rank1.json"]
    assert not (root / "step-00000006" / "failed").exists()
    assert committed_steps(local_records(open_storage(str(root)))) == []


def test_a_writer_that_stops_drops_partner_copies_of_steps_that_did_not_commit(root, tmp_path, writers):
    """Rank 1 receives rank 0's copy of step 7, but its own part fails, so step 7 never commits on the local level:
    when rank 1's writer stops, its local tier (the one deleter of local_dir) deletes that copy. A copy of a step
    that committed stays."""
    starts = two_level_starts(root, tmp_path, commit_timeout_s=60.0)
    inboxes = _run(writers, starts, tmp_path, step=7, save_id=4, levels=LOCAL, skip_plan_of=1)
    assert all(isinstance(ib.outcome(4), SaveFailed) for ib in inboxes)
    received = tmp_path / "local1" / "partners" / "step-00000007"
    eventually(lambda: received.is_dir() and list(received.iterdir()))  # rank 0's copy arrived
    for w in writers:
        w.close()
    writers.clear()
    assert not received.exists()

    again = tmp_path / "again"
    again.mkdir()
    inboxes = _run(writers, two_level_starts(root, again), again, step=8, save_id=5, levels=LOCAL)
    assert all(isinstance(ib.outcome(5), SaveDone) for ib in inboxes)
    for w in writers:
        w.close()
    writers.clear()
    assert list((again / "local1" / "partners" / "step-00000008").iterdir())
