"""The job pipeline and the durable level in one process: SaveJob in, SlotFree and one outcome out, a committed
step that plain ``dcp.load`` reads back bit-exact; failures of the shared part and of the durable level's own
part, each ending the save once, with its marker where the rule puts it."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import torch

from ckptio.engine.protocol import SaveDone, SaveFailed
from ckptio.engine.writer.pipeline import Writer
from ckptio.errors import CkptError
from ckptio.format import RankIndex, committed_steps, read_latest, read_manifest, verify_step
from ckptio.storage import open_storage
from ckptio.testing.wrappers import FaultStorage
from tests.engine.writer.harness import Inbox, eventually, load_step, plan_ranks, run, save_job, state, writer_start


def _writer(writers: list[Writer], inbox: Inbox, root: Path | object, **kw: object) -> Writer:
    start = writer_start(root if not isinstance(root, Path) else str(root), **kw)  # type: ignore[arg-type]
    writer = Writer(start, inbox.outbox(start.rank))
    writers.append(writer)
    return writer


def test_a_save_commits_frees_its_slot_once_and_reads_back_bit_exact(root, tmp_path, writers, inbox):
    w = _writer(writers, inbox, root)
    s = state(1, keys=("w", "b"))
    s["epoch"] = 3  # a pickled object rides in file 0
    (rank0,) = plan_ranks([s])
    w.add_plan(rank0.plan)
    run(w, save_job(rank0, s, tmp_path / "slot", step=1, save_id=11))
    done = inbox.outcome(11)
    assert isinstance(done, SaveDone) and done.info.total_bytes > 0
    assert inbox.slots_freed(11) == 1 and len(inbox.outcomes(11)) == 1
    back = load_step(root / "step-00000001", s)
    assert torch.equal(back["w"], s["w"]) and torch.equal(back["b"], s["b"]) and back["epoch"] == 3
    assert read_manifest(open_storage(str(root)), 1).save_id == 11


def test_two_ranks_commit_one_step_together(root, tmp_path, writers):
    inboxes = [Inbox(), Inbox()]
    states = [state(1, keys=("a",)), state(2, keys=("b",))]
    plans = plan_ranks(states)
    ws = [_writer(writers, inboxes[r], root, rank=r, world_size=2) for r in (1, 0)][::-1]
    for r in (1, 0):  # rank 1 first: rank 0's committer then finds both indexes at once
        ws[r].add_plan(plans[r].plan)
        run(ws[r], save_job(plans[r], states[r], tmp_path / f"slot{r}", step=4, save_id=7))
    assert all(isinstance(ib.outcome(7), SaveDone) for ib in inboxes)
    back = load_step(root / "step-00000004", {**states[0], **states[1]})
    assert torch.equal(back["a"], states[0]["a"]) and torch.equal(back["b"], states[1]["b"])


def test_a_failed_shared_part_fails_every_rank_at_once_through_its_marker(root, tmp_path, writers):
    """Rank 1 has no plan for its job (its shared part fails): its marker goes to the durable records, rank 0's
    committer ends on it long before commit_timeout_s, and does not mark the failure a second time."""
    inboxes = [Inbox(), Inbox()]
    states = [state(1, keys=("a",)), state(2, keys=("b",))]
    plans = plan_ranks(states)
    ws = [_writer(writers, inboxes[r], root, rank=r, world_size=2, commit_timeout_s=60.0) for r in (0, 1)]
    ws[0].add_plan(plans[0].plan)
    t0 = time.monotonic()
    run(ws[0], save_job(plans[0], states[0], tmp_path / "slot0", step=2, save_id=5))
    run(ws[1], save_job(plans[1], states[1], tmp_path / "slot1", step=2, save_id=5))  # plan never added
    failed = [ib.outcome(5) for ib in inboxes]
    assert all(isinstance(f, SaveFailed) and isinstance(f.error, CkptError) for f in failed)
    assert time.monotonic() - t0 < 30  # the marker, not the 60 s timeout
    assert "another rank failed" in str(failed[0].error)  # type: ignore[union-attr]
    markers = sorted(p.name for p in (root / "step-00000002" / "failed").iterdir())
    assert markers == ["rank1.json"]
    assert inboxes[1].slots_freed(5) == 1
    assert not list((root / "step-00000002").glob("*.distcp"))  # rank 0 discarded its files too
    assert committed_steps(open_storage(str(root))) == []


def test_a_failed_durable_index_fails_the_save_and_deletes_its_files(root, tmp_path, writers, inbox):
    durable = FaultStorage(open_storage(str(root), fsync=False), errno_code=errno.EIO, fail_keys_with="ranks/")
    w = _writer(writers, inbox, durable)
    s = state(3)
    (rank0,) = plan_ranks([s])
    w.add_plan(rank0.plan)
    run(w, save_job(rank0, s, tmp_path / "slot", step=3, save_id=9))
    failed = inbox.outcome(9)
    assert isinstance(failed, SaveFailed) and "injected EIO" in str(failed.error)
    assert inbox.slots_freed(9) == 1
    assert [p.name for p in (root / "step-00000003" / "failed").iterdir()] == ["rank0.json"]
    assert not list((root / "step-00000003").glob("*.distcp"))


def test_retention_keeps_the_newest_steps_and_a_step_saved_again_supersedes_its_own(root, tmp_path, writers, inbox):
    w = _writer(writers, inbox, root, keep_last=2)
    s = state(4)
    (rank0,) = plan_ranks([s])
    w.add_plan(rank0.plan)
    for step in (1, 2, 3):
        run(w, save_job(rank0, s, tmp_path / "slot", step=step, save_id=step))
        assert isinstance(inbox.outcome(step), SaveDone)
    newer = state(5)
    run(w, save_job(rank0, newer, tmp_path / "slot", step=3, save_id=4, replaces=(3,)))
    assert isinstance(inbox.outcome(4), SaveDone)
    storage = open_storage(str(root))
    eventually(lambda: committed_steps(storage) == [2, 3])
    assert read_manifest(storage, 3).save_id == 4
    eventually(lambda: [p.name for p in (root / "step-00000003").glob("*.distcp")] == ["__0_0-0000000000004.distcp"],
               why=lambda: (sorted(p.name for p in (root / "step-00000003").iterdir()), inbox.events("retry"),
                            inbox.summary()))
    assert torch.equal(load_step(root / "step-00000003", newer)["w"], newer["w"])


def test_a_local_tier_holds_the_files_until_the_next_commit_evicts_them(root, tmp_path, writers, inbox):
    local = tmp_path / "local"
    w = _writer(writers, inbox, root, local=open_storage(str(local), fsync=False), local_dir=str(local))
    s = state(6)
    (rank0,) = plan_ranks([s])
    w.add_plan(rank0.plan)
    run(w, save_job(rank0, s, tmp_path / "slot", step=1, save_id=1))
    assert isinstance(inbox.outcome(1), SaveDone)
    assert (local / "step-00000001").is_dir()  # a cache of the newest step
    run(w, save_job(rank0, s, tmp_path / "slot", step=2, save_id=2))
    assert isinstance(inbox.outcome(2), SaveDone)
    eventually(lambda: not (local / "step-00000001").exists())
    assert (local / "step-00000002").is_dir()
    assert torch.equal(load_step(root / "step-00000002", s)["w"], s["w"])


def test_small_tensors_share_files_big_ones_get_their_own_and_the_records_agree(root, tmp_path, writers, inbox):
    """300 tiny tensors and two 3 MiB ones with a 4 MiB file cap (formerly test_roundtrip's, through a
    Checkpointer): the tiny ones are coalesced, the manifest lists exactly the data files, the index is the save's,
    ``latest`` moves and verify passes."""
    w = _writer(writers, inbox, root)
    s = {f"t{i}": torch.full((4,), float(i)) for i in range(300)}
    s["big0"], s["big1"] = torch.ones(768, 1024), torch.ones(768, 1024)
    (rank0,) = plan_ranks([s], file_size_bytes=4 << 20)
    w.add_plan(rank0.plan)
    run(w, save_job(rank0, s, tmp_path / "slot", step=7, save_id=3))
    assert isinstance(inbox.outcome(3), SaveDone)
    storage = open_storage(str(root))
    names = sorted(p.name for p in (root / "step-00000007").iterdir())
    assert {".metadata", "manifest.json", "ranks"} <= set(names)
    data_files = [n for n in names if n.endswith(".distcp")]
    assert 2 <= len(data_files) <= 3, data_files
    manifest = read_manifest(storage, 7)
    assert set(manifest.files) == set(data_files) and manifest.world_size == 1
    assert RankIndex.from_json(storage.get("step-00000007/ranks/0.json")).save_id == manifest.save_id == 3
    assert read_latest(storage) == 7 and verify_step(storage, 7).ok
    back = load_step(root / "step-00000007", s)
    assert all(torch.equal(back[k], v) for k, v in s.items())


def test_a_save_over_a_crashed_attempt_at_its_step_commits_and_its_leftovers_go(root, tmp_path, writers, inbox):
    crashed = root / "step-00000005"
    (crashed / "ranks").mkdir(parents=True)  # a crashed attempt: a data file and a stale rank index
    (crashed / "__0_0-0000000000001.distcp").write_bytes(b"garbage")
    (crashed / "ranks" / "0.json").write_text(
        '{"format": "ckptio-rank-index/1", "step": 5, "rank": 0, "world_size": 1, "save_id": 1, "files": [], '
        '"items": []}')
    w = _writer(writers, inbox, root)
    s = state(9)
    (rank0,) = plan_ranks([s])
    w.add_plan(rank0.plan)
    run(w, save_job(rank0, s, tmp_path / "slot", step=5, save_id=2))
    assert isinstance(inbox.outcome(2), SaveDone)
    assert torch.equal(load_step(crashed, s)["w"], s["w"])
    # The committed step lists only its own files; the crashed attempt's data file is gone.
    eventually(lambda: not (crashed / "__0_0-0000000000001.distcp").exists())
