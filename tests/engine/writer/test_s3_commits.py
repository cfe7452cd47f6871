"""The commit path on the session's S3 server, in one process (formerly Checkpointer-driven tests in
tests/engine/test_s3_engine.py): hash-prefixed data keys recorded in the manifest and followed by retention, and
two jobs racing to commit one step, of which exactly one wins."""

from __future__ import annotations

import pytest

from ckptio import format as fmt
from ckptio.engine.protocol import SaveDone, SaveFailed
from ckptio.engine.writer.pipeline import Writer
from ckptio.errors import CommitError
from ckptio.storage import open_storage
from tests.engine.writer.harness import Inbox, eventually, plan_ranks, run, save_job, state, writer_start

pytestmark = [pytest.mark.s3]


def _keys(s3_client, bucket: str, prefix: str) -> list[str]:
    pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_hash_prefixed_data_keys_are_recorded_and_retention_follows_them(s3_bucket, s3_client, tmp_path, writers,
                                                                         inbox):
    storage = open_storage(f"s3://{s3_bucket}/hashed", hash_prefix=True)
    w = Writer(writer_start(storage, keep_last=1), inbox.outbox(0))
    writers.append(w)
    s = state(7, keys=("w",))
    (rank0,) = plan_ranks([s])
    w.add_plan(rank0.plan)
    for step in (1, 2):
        run(w, save_job(rank0, s, tmp_path / "slot", step=step, save_id=step))
        assert isinstance(inbox.outcome(step), SaveDone)
    eventually(lambda: fmt.committed_steps(storage) == [2])
    data = [k for k in _keys(s3_client, s3_bucket, "hashed/") if k.endswith(".distcp")]
    assert data and all(k.startswith("hashed/h-") and "/step-00000002/" in k for k in data), data  # step 1's went
    manifest = fmt.read_manifest(storage, 2)
    assert [rec.key for rec in manifest.files.values()] == [k.removeprefix("hashed/") for k in data]
    assert fmt.verify_step(storage, 2).ok


def test_two_jobs_committing_one_step_on_s3_one_wins(s3_bucket, tmp_path):
    """Two single-rank jobs on one root (ownership off: the race it guards against): both write step 1, one
    commits, the other fails with CommitError, and the step is whole."""
    root = f"s3://{s3_bucket}/race"
    inboxes = [Inbox(), Inbox()]
    writers = [Writer(writer_start(open_storage(root), commit_timeout_s=60.0), ib.outbox(0)) for ib in inboxes]
    states = [state(1, keys=("w",)), state(2, keys=("w",))]
    try:
        for n, (writer, s) in enumerate(zip(writers, states, strict=True)):
            (rank0,) = plan_ranks([s])
            writer.add_plan(rank0.plan)
            run(writer, save_job(rank0, s, tmp_path / f"slot{n}", step=1, save_id=10 + n))
        outcomes = [ib.outcome(10 + n) for n, ib in enumerate(inboxes)]
    finally:
        for writer in writers:
            writer.close()
    assert sorted(type(o).__name__ for o in outcomes) == ["SaveDone", "SaveFailed"]
    lost = next(o for o in outcomes if isinstance(o, SaveFailed))
    assert isinstance(lost.error, CommitError)
    storage = open_storage(root)
    won = fmt.read_manifest(storage, 1).save_id
    assert won == next(10 + n for n, o in enumerate(outcomes) if isinstance(o, SaveDone))
    assert fmt.verify_step(storage, 1).ok
