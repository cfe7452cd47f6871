"""Issue 20 items 1 and 4: a save and its commit cost the same storage operations on a root holding 1 step as on
one holding 100 retained steps or 100 leftovers, and exactly what ``format.commit_ops`` computes from the job's
shape (the numbers the planner prints). Counted with OpCountingStorage around the durable root, in one process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptio.engine.protocol import SaveDone
from ckptio.engine.writer.pipeline import Writer
from ckptio.format import step_dir
from ckptio.format.commit_ops import CommitShape, commit_ops
from ckptio.storage import open_storage
from ckptio.testing.wrappers import OpCountingStorage
from tests.engine.writer.harness import Inbox, eventually, plan_ranks, run, save_job, state, writer_start

KEYS = ("a", "b", "c")  # three tensors; one file each with a 1 MiB file cap


def _fabricate(root: Path, first: int, count: int) -> None:
    """Steps first+1..first+count-1 as copies of committed step ``first`` (their records say their own step)."""
    src = root / step_dir(first)
    for step in range(first + 1, first + count):
        dst = root / step_dir(step)
        shutil.copytree(src, dst)
        for record in [dst / "manifest.json", *(dst / "ranks").iterdir()]:
            body = json.loads(record.read_text())
            body["step"] = step
            record.write_text(json.dumps(body))


def _leftovers(root: Path, count: int) -> None:
    """Attempts that never committed, above every step saved here (in flight, as far as cleanup can tell)."""
    for i in range(count):
        d = root / step_dir(100_000 + i)
        (d / "ranks").mkdir(parents=True)
        (d / "__0_0-0000000000001.distcp").write_bytes(b"x" * 100)
        (d / "ranks" / "0.json").write_text("{}")


def _measured(root: Path, tmp_path: Path, *, keep_last: int) -> dict[str, int]:
    """One save's and commit's operations, after a first save warmed the writer up (its start's sweep)."""
    s = state(1, keys=KEYS, numel=200_000)
    (rank0,) = plan_ranks([s], file_size_bytes=1 << 20)
    counting = OpCountingStorage(open_storage(str(root), fsync=False))
    inbox = Inbox()
    writer = Writer(writer_start(counting, keep_last=keep_last), inbox.outbox(0))
    try:
        writer.add_plan(rank0.plan)
        for step, save_id in ((1000, 1000), (1001, 1001)):
            if step == 1001:
                before = counting.snapshot()
            run(writer, save_job(rank0, s, tmp_path / "slot", step=step, save_id=save_id))
            assert isinstance(inbox.outcome(save_id), SaveDone)
            eventually(lambda: writer.durable.committer.unfinished() == 0)  # its cleanup too
        after = counting.snapshot()
    finally:
        writer.close()
    assert rank0.plan.layout.n_files == len(KEYS)
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


@pytest.mark.parametrize(("retained", "leftovers"), [(1, 0), (100, 0), (1, 100)])
def test_a_commit_costs_the_same_operations_whatever_the_root_holds(root, tmp_path, retained, leftovers):
    s = state(1, keys=KEYS, numel=200_000)
    (rank0,) = plan_ranks([s], file_size_bytes=1 << 20)
    first = Writer(writer_start(str(root), keep_last=0), Inbox().outbox(0))
    first.add_plan(rank0.plan)
    run(first, save_job(rank0, s, tmp_path / "slot", step=1, save_id=1))
    first.close()
    _fabricate(root, 1, retained)
    _leftovers(root, leftovers)
    # keep_last=retained+1: the warm-up save keeps every step, the measured one retires the oldest.
    measured = _measured(root, tmp_path, keep_last=retained + 1)
    expected = commit_ops(CommitShape(world_size=1, files_per_rank=len(KEYS), keep_last=retained + 1)).total
    assert measured == {k: v for k, v in expected.items() if v}
    assert "list_dirs" not in measured  # nothing on the commit path lists the root
    assert len(list(root.glob("step-0010????"))) == leftovers  # leftovers in flight are left alone


def test_a_local_level_commit_deletes_nothing_of_the_nodes_files_under_the_root():
    ops = commit_ops(CommitShape(world_size=4, files_per_rank=2, keep_last=1, level="local"))
    durable = commit_ops(CommitShape(world_size=4, files_per_rank=2, keep_last=1))
    assert ops.per_save == {"put": 4, "get": 3}
    assert durable.per_commit["delete"] - ops.per_commit["delete"] == 8  # the data files live on the nodes
