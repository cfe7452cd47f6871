"""A supersede a crash interrupted, in one process: every reader resolves it to the save whose ``.metadata`` is in
place, and the next writer finishes it at start (the right manifest in place, the pending record and the other
save's data files gone). The crash itself, kill -9 at each point on real processes: tests/engine/
test_supersede_crash.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckptio.engine.protocol import SaveDone
from ckptio.engine.writer.pipeline import Writer
from ckptio.format import read_manifest, step_dir
from ckptio.format.supersede import PendingSupersede, pending_supersede, write_pending
from ckptio.storage import open_storage
from tests.engine.writer.harness import Inbox, eventually, load_step, plan_ranks, run, save_job, state, writer_start


def _interrupted(root: Path, tmp_path: Path, *, metadata_of: str) -> dict[str, dict[str, torch.Tensor]]:
    """Step 1 saved as A (save 1), then superseded by B (save 2); then put back as a kill -9 would have left it
    after the pending record was written and, with ``metadata_of="B"``, after the new .metadata too."""
    states = {"A": state(1), "B": state(2)}
    (rank0,) = plan_ranks([states["A"]])
    d = root / step_dir(1)
    inbox = Inbox()
    writer = Writer(writer_start(str(root), keep_last=0), inbox.outbox(0))
    writer.add_plan(rank0.plan)
    try:
        run(writer, save_job(rank0, states["A"], tmp_path / "slot", step=1, save_id=1))
        assert isinstance(inbox.outcome(1), SaveDone)
        kept = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}  # A's manifest, .metadata, data
        run(writer, save_job(rank0, states["B"], tmp_path / "slot", step=1, save_id=2, replaces=(1,)))
        assert isinstance(inbox.outcome(2), SaveDone)
    finally:
        writer.close()
    storage = open_storage(str(root))
    new = storage.get(f"{step_dir(1)}/manifest.json")
    write_pending(storage, 1, PendingSupersede(old=kept["manifest.json"], new=new))
    (d / "manifest.json").write_bytes(kept["manifest.json"])  # the compare-and-swap had not happened
    for name, body in kept.items():
        if name.endswith(".distcp") or (name == ".metadata" and metadata_of == "A"):
            (d / name).write_bytes(body)
    return states


@pytest.mark.parametrize("metadata_of", ["A", "B"])
def test_an_interrupted_supersede_reads_as_the_save_whose_metadata_is_in_place_and_the_next_writer_finishes_it(
        root, tmp_path, metadata_of):
    states = _interrupted(root, tmp_path, metadata_of=metadata_of)
    storage = open_storage(str(root))
    save_id = {"A": 1, "B": 2}[metadata_of]
    assert read_manifest(storage, 1).save_id == save_id  # though manifest.json still says save 1
    assert torch.equal(load_step(root / step_dir(1), states[metadata_of])["w"], states[metadata_of]["w"])

    writer = Writer(writer_start(str(root), keep_last=0), Inbox().outbox(0))  # its start finishes the supersede
    try:
        eventually(lambda: pending_supersede(storage, 1) is None)
    finally:
        writer.close()
    assert read_manifest(storage, 1).save_id == save_id
    assert storage.get(f"{step_dir(1)}/manifest.json") == read_manifest(storage, 1).to_json()
    other = {"A": "__0_0-0000000000002.distcp", "B": "__0_0-0000000000001.distcp"}[metadata_of]
    assert not (root / step_dir(1) / other).exists()
    assert torch.equal(load_step(root / step_dir(1), states[metadata_of])["w"], states[metadata_of]["w"])
