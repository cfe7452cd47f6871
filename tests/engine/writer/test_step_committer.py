"""The commit protocol of one level, driven through CommitRequest: rank 0 commits once every rank's index of the
save is in the records; a watcher (any other rank) ends on its own save's manifest, on the record of a step
retention already removed, on a drop marker (dropped, no marker of its own) or on its own timeout (failed, marked
so the other ranks end too)."""

from __future__ import annotations

import time
from pathlib import Path

from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.protocol import JobLevels, SaveDone, SaveDropped, SaveFailed
from ckptio.engine.writer.level_cleanup import CommittedSteps
from ckptio.engine.writer.level_outcome import Attempt, LevelOutcome
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.step_committer import CommitLevel, CommitRequest, StepCommitter
from ckptio.format import FileRecord, Manifest, RankIndex, index_key, write_failure, write_manifest
from ckptio.format.retention import RETIRED
from ckptio.storage import open_storage
from tests.engine.writer.harness import Inbox, plan_ranks, state, writer_start


def _committer(root: Path, inbox: Inbox, *, rank: int, world_size: int = 2, **options) -> StepCommitter:
    start = writer_start(str(root), rank=rank, world_size=world_size, **options)
    live = LiveSteps()
    discarded: list[Attempt] = []
    outcome = LevelOutcome("durable", start, inbox.outbox(rank), live, markers=FailureMarkers(start.durable),
                           discard=discarded.append)
    committer = StepCommitter(CommitLevel("durable", CommittedSteps(start.durable), keep_last=0), start,
                              inbox.outbox(rank), live, outcome=outcome)
    committer.discarded = discarded  # type: ignore[attr-defined]
    return committer


def _request(step: int, save_id: int, **kw) -> CommitRequest:
    return CommitRequest(attempt=Attempt(step, save_id, 1, JobLevels()), metadata_skeleton=None, **kw)


def _manifest(step: int, save_id: int) -> Manifest:
    return Manifest(step=step, world_size=2, save_id=save_id, files={}, total_bytes=0)


def test_a_watcher_ends_on_its_own_saves_manifest_not_on_the_one_it_supersedes(root, inbox):
    storage = open_storage(str(root))
    write_manifest(storage, _manifest(1, 1))  # the save this one supersedes: rank 0 replaces it
    committer = _committer(root, inbox, rank=1)
    committer.submit(_request(1, 2, replaces=(1,)))
    try:
        time.sleep(0.3)  # the watcher polls meanwhile, and sees the superseded save's manifest only
        assert inbox.outcomes(2) == []
        storage.delete("step-00000001/manifest.json")
        write_manifest(storage, _manifest(1, 2))
        assert isinstance(inbox.outcome(2), SaveDone)
    finally:
        committer.close()


def test_a_watcher_learns_from_the_retired_record_that_its_step_committed_and_went(root, inbox):
    open_storage(str(root)).put(RETIRED, b'{"4": 9}')
    committer = _committer(root, inbox, rank=1)
    committer.submit(_request(4, 9))
    try:
        assert isinstance(inbox.outcome(9), SaveDone)
    finally:
        committer.close()


def test_a_drop_marker_drops_the_save_and_a_failure_marker_fails_it_without_a_second_marker(root, inbox):
    storage = open_storage(str(root))
    write_failure(storage, 5, "rank0", 3, "no free slot", dropped=True)
    write_failure(storage, 6, "rank0", 4, RuntimeError("disk on fire"))
    committer = _committer(root, inbox, rank=1)
    committer.submit(_request(5, 3))
    committer.submit(_request(6, 4))
    try:
        assert isinstance(inbox.outcome(3), SaveDropped)
        failed = inbox.outcome(4)
        assert isinstance(failed, SaveFailed) and "disk on fire" in str(failed.error)
        assert [p.name for p in (root / "step-00000006" / "failed").iterdir()] == ["rank0.json"]
        assert [a.save_id for a in committer.discarded] == [3, 4]  # type: ignore[attr-defined]
    finally:
        committer.close()


def test_a_watcher_that_times_out_marks_the_failure_for_the_other_ranks(root, inbox):
    committer = _committer(root, inbox, rank=1, commit_timeout_s=0.3)
    committer.submit(_request(7, 5))
    try:
        failed = inbox.outcome(5)
        assert isinstance(failed, SaveFailed) and "timed out" in str(failed.error)
        assert [p.name for p in (root / "step-00000007" / "failed").iterdir()] == ["rank1.json"]
    finally:
        committer.close()


def test_rank_0_commits_once_every_ranks_index_is_in(root, inbox, tmp_path):
    storage = open_storage(str(root))
    states = [state(1, keys=("a",)), state(2, keys=("b",))]
    skeleton = plan_ranks(states)[0].plan.metadata_skeleton
    committer = _committer(root, inbox, rank=0)
    committer.submit(CommitRequest(attempt=Attempt(2, 8, 1, JobLevels()), metadata_skeleton=skeleton))
    try:
        for rank in (0, 1):
            assert inbox.outcomes(8) == []  # waiting for the indexes
            rec = FileRecord(name=f"__{rank}_0-0000000000008.distcp", size=0, crc32c="00000000")
            storage.put(index_key(2, rank), RankIndex(step=2, rank=rank, world_size=2, save_id=8, files=[rec],
                                                     items=[]).to_json())
        done = inbox.outcome(8)
        assert isinstance(done, SaveDone) and done.info.files == 2
        assert storage.exists("step-00000002/.metadata") and storage.get("latest") == b"2"
    finally:
        committer.close()


def test_rank_0_refuses_at_once_a_step_another_save_committed(root, inbox):
    storage = open_storage(str(root))
    write_manifest(storage, _manifest(3, 1))
    storage.put(index_key(3, 0), RankIndex(step=3, rank=0, world_size=2, save_id=2, files=[], items=[]).to_json())
    storage.put(index_key(3, 1), RankIndex(step=3, rank=1, world_size=2, save_id=1, files=[], items=[]).to_json())
    committer = _committer(root, inbox, rank=0, commit_timeout_s=60.0)
    committer.submit(_request(3, 2))
    try:
        failed = inbox.outcome(2, timeout=20)
        assert isinstance(failed, SaveFailed) and "already committed by another save" in str(failed.error)
        assert [p.name for p in (root / "step-00000003" / "failed").iterdir()] == ["commit.json"]
    finally:
        committer.close()
