"""Full disks on the writer side, in one process (issue 09 item 5, formerly tests/engine/test_disk_full.py and
test_bad_input.py's budget test through whole Checkpointers): a failed attempt leaves nothing on either tier and
the next save commits; a local tier that runs out of space evicts what is superseded, then writes the durable
tier only with a ``local_tier_full`` event; a local tier budget refuses a save that can never fit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import torch

from ckptio.engine.protocol import SaveDone, SaveFailed
from ckptio.engine.writer.pipeline import Writer
from ckptio.errors import StorageFullError
from ckptio.format import committed_steps
from ckptio.storage import open_storage
from ckptio.testing.wrappers import FaultStorage
from tests.engine.writer.harness import eventually, load_step, plan_ranks, run, save_job, state, writer_start

MiB = 1 << 20


def _data_files(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*.distcp"))


def test_a_failed_upload_leaves_nothing_on_either_tier_and_the_next_save_commits(root, tmp_path, writers, inbox):
    local_dir = tmp_path / "local"
    durable = FaultStorage(open_storage(str(root), fsync=False), errno_code=errno.ENOSPC,
                           fail_keys_with="-0000000000001")  # every data file of attempt 1
    w = Writer(writer_start(durable, local=open_storage(str(local_dir), fsync=False), local_dir=str(local_dir),
                            upload_concurrency=1), inbox.outbox(0))
    writers.append(w)
    s = state(1, keys=("a", "b", "c", "d"), numel=200_000)  # four files of 800 KB with a 1 MiB cap
    (rank0,) = plan_ranks([s], file_size_bytes=MiB)
    w.add_plan(rank0.plan)
    run(w, save_job(rank0, s, tmp_path / "slot", step=1, save_id=1))  # every upload of attempt 1 fails
    failed = inbox.outcome(1)
    assert isinstance(failed, SaveFailed) and isinstance(failed.error, StorageFullError)
    assert _data_files(root) == [] and _data_files(local_dir) == []
    run(w, save_job(rank0, s, tmp_path / "slot", step=2, save_id=2))
    assert isinstance(inbox.outcome(2), SaveDone)
    back = load_step(root / "step-00000002", s)
    assert all(torch.equal(back[k], s[k]) for k in s)


def test_a_full_local_tier_evicts_then_writes_durable_only_and_later_saves_keep_working(root, tmp_path, writers,
                                                                                          inbox):
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    local = FaultStorage(open_storage(str(local_dir), fsync=False), capacity_bytes=6 * MiB)
    w = Writer(writer_start(str(root), local=local, local_dir=str(local_dir), keep_last=0, upload_concurrency=1),
               inbox.outbox(0))
    writers.append(w)
    states = {step: state(step, keys=("w",), numel=1 << 20) for step in (1, 2, 3, 4)}  # 4 MiB each
    (rank0,) = plan_ranks([states[1]], file_size_bytes=64 * MiB)
    w.add_plan(rank0.plan)
    for step in (1, 2):  # 4 + 4 > 6 MiB: step 1, committed (so superseded), is evicted to make room for step 2
        run(w, save_job(rank0, states[step], tmp_path / "slot", step=step, save_id=step))
        assert isinstance(inbox.outcome(step), SaveDone)
    eventually(lambda: sorted(os.listdir(local_dir)) == ["step-00000002"])
    (local_dir / "ballast").write_bytes(b"\0" * (5 * MiB))  # now nothing evictable frees enough
    for step in (3, 4):
        run(w, save_job(rank0, states[step], tmp_path / "slot", step=step, save_id=step))
        assert isinstance(inbox.outcome(step), SaveDone)  # durable only, with a warning event
    assert {e["step"] for e in inbox.events("local_tier_full")} == {3, 4}
    eventually(lambda: _data_files(local_dir) == [])  # refused attempts left nothing; step 2 went with step 3's commit
    assert committed_steps(open_storage(str(root))) == [1, 2, 3, 4]
    assert torch.equal(load_step(root / "step-00000003", states[3])["w"], states[3]["w"])


def test_a_local_budget_evicts_durable_steps_and_refuses_a_save_that_can_never_fit(root, tmp_path, writers, inbox):
    local_dir = tmp_path / "local"
    w = Writer(writer_start(str(root), local=open_storage(str(local_dir), fsync=False), local_dir=str(local_dir),
                            local_capacity_bytes=3 * MiB, keep_last=0), inbox.outbox(0))
    writers.append(w)
    small = state(1, keys=("w",), numel=512 * 1024)  # 2 MiB
    (rank0,) = plan_ranks([small], file_size_bytes=64 * MiB)
    w.add_plan(rank0.plan)
    for step in (1, 2, 3):  # each save evicts the older, already durable local step
        run(w, save_job(rank0, small, tmp_path / "slot", step=step, save_id=step))
        assert isinstance(inbox.outcome(step), SaveDone)
    big = state(2, keys=("w",), numel=1 << 20)  # 4 MiB can never fit in 3 MiB
    (bigger,) = plan_ranks([big], plan_id=2, file_size_bytes=64 * MiB)
    w.add_plan(bigger.plan)
    run(w, save_job(bigger, big, tmp_path / "slot", step=4, save_id=4))
    failed = inbox.outcome(4)
    assert isinstance(failed, SaveFailed) and "local tier budget" in str(failed.error)
    eventually(lambda: sorted(os.listdir(local_dir)) == ["step-00000003"])
    assert committed_steps(open_storage(str(root))) == [1, 2, 3]  # the durable tier lost nothing
