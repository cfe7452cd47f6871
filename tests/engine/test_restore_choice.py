"""Rank 0's choice of the step to restore waits on the store, and every rank waits on rank 0: its lookups must not
grow with the steps a root keeps, and the durable and local levels are looked up side by side (issue 19: on the
lab's loaded store the choice took 0.3 s of a 1.2 s restore, a round trip per kept step, in series).

Real files, one process; operations are counted by a storage wrapper, and "side by side" is shown by a meeting
both lookups must attend at once (run one after the other, the first waits alone and the test fails).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
from ckptio import format as fmt
from ckptio.engine.restore.step_restore import DurableStep, choose_durable
from ckptio.engine.restore.two_level_restore import _decide
from ckptio.format.local_level_records import local_records
from ckptio.storage import open_storage
from ckptio.storage.base import Storage
from ckptio.storage.storage_wrapper import StorageWrapper
from ckptio.testing.wrappers import OpCountingStorage


def _root_with(tmp_path: Path, committed: int, *, in_flight: bool = True) -> str:
    """A root of ``committed`` steps whose manifests exist, and (``in_flight``) a newer save not committed yet: its
    rank index and ``.metadata`` written, no manifest."""
    root = tmp_path / f"root-{committed}"
    for step in range(1, committed + 1):
        (root / fmt.step_dir(step)).mkdir(parents=True)
        (root / fmt.manifest_key(step)).write_text("{}")
    if in_flight:
        attempt = root / fmt.step_dir(committed + 1)
        (attempt / "ranks").mkdir(parents=True)
        (attempt / "ranks" / "0.json").write_text("{}")
        (attempt / ".metadata").write_bytes(b"x")
    return str(root)


@pytest.mark.parametrize("kept", [3, 40])
def test_the_newest_step_costs_the_same_lookups_however_many_steps_the_root_keeps(tmp_path, kept):
    counted = OpCountingStorage(open_storage(_root_with(tmp_path, kept)))
    assert choose_durable(counted, None) == DurableStep(kept, False)
    # One listing; the save in flight (manifest? .metadata? manifest? rank index?) and the newest committed step.
    assert counted.snapshot() == {"list_dirs": 1, "head": 4, "list": 1}
    counted = OpCountingStorage(counted.inner)
    assert fmt.newest_committed_step(counted) == kept
    assert counted.snapshot() == {"list_dirs": 1, "head": 2}


def test_the_newest_step_is_still_a_plain_dcp_checkpoint_newer_than_every_committed_one(tmp_path):
    root = _root_with(tmp_path, 3, in_flight=False)
    dcp.save({"w": torch.zeros(4)}, checkpoint_id=os.path.join(root, fmt.step_dir(9)))
    assert choose_durable(open_storage(root), None) == DurableStep(9, True)
    older = _root_with(tmp_path, 12, in_flight=False)
    dcp.save({"w": torch.zeros(4)}, checkpoint_id=os.path.join(older, fmt.step_dir(0)))
    assert choose_durable(open_storage(older), None) == DurableStep(12, False)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert choose_durable(open_storage(str(empty)), None) is None
    assert fmt.newest_committed_step(open_storage(str(empty))) is None


class _Meeting(StorageWrapper):
    """Every ``list_dirs`` waits until the other storage sharing ``barrier`` lists too (BrokenBarrierError after
    10 s alone)."""

    def __init__(self, inner: Storage, barrier: threading.Barrier) -> None:
        super().__init__(inner)
        self.barrier = barrier

    def list_dirs(self, prefix: str = "") -> list[str]:
        self.barrier.wait()
        return self.inner.list_dirs(prefix)


def test_rank_0_looks_up_the_durable_and_the_local_level_side_by_side(tmp_path):
    root, local = str(tmp_path / "root"), str(tmp_path / "local")
    with ckptio.Checkpointer(root, local_dir=local, durable_every=2, replicas=0, volume_check="off") as ck:
        for step in (1, 2):
            ck.save(step, {"w": torch.full((64,), float(step))}).wait(timeout=120)
    durable = open_storage(root)
    meeting = threading.Barrier(2, timeout=10)
    decision = _decide(_Meeting(durable, meeting), _Meeting(local_records(durable), meeting), None, 1)
    assert decision.durable == 2 and decision.local is not None and decision.local.step == 2
    assert decision.durable_fallback  # the same save on both levels
    assert not meeting.broken


def test_rank_0_reads_the_newest_local_manifest_without_looking_it_up_first(tmp_path):
    # The local level's newest step is what a node loss restores: its manifest and .metadata are read at once after
    # the listing (one round trip), where an existence check first cost another behind the restarting job's reads.
    root, local = str(tmp_path / "root"), str(tmp_path / "local")
    with ckptio.Checkpointer(root, local_dir=local, durable_every=2, replicas=0, volume_check="off") as ck:
        for step in (1, 2, 3):
            ck.save(step, {"w": torch.full((64,), float(step))}).wait(timeout=120)
    records = OpCountingStorage(local_records(open_storage(root)))
    decision = _decide(open_storage(root), records, None, 1)
    assert decision.local is not None and decision.local.step == 3 and decision.metadata is not None
    assert "head" not in records.snapshot() and "exists" not in records.snapshot(), records.snapshot()
