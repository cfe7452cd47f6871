"""Issue 20 item 2: commits that keep up. A committer slowed down (every manifest operation takes 0.25 s) never
lets more than ``max_pending`` + 1 saves sit written but uncommitted on the root: the writer holds the next save's
files back (a ``commit_behind`` event), its staging slot stays busy, and the trainer's overflow rule does the rest
(``skip``: the save is skipped; ``block``: save() waits). Every handle ends with its true outcome."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

import ckptio
from ckptio.format import committed_steps
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import LatencyStorage

pytestmark = [pytest.mark.slow]
MAX_PENDING = 1


def _written_uncommitted(root: Path) -> int:
    """Steps above the newest commit whose data files are on the root (a crash now would lose them)."""
    dirs = [d for d in root.glob("step-*") if d.is_dir()]
    committed = [int(d.name[5:]) for d in dirs if (d / "manifest.json").exists()]
    newest = max(committed, default=-1)
    return sum(1 for d in dirs if int(d.name[5:]) > newest and any(d.glob("*.distcp")))


@pytest.mark.parametrize("overflow", ["skip", "block"])
def test_a_slow_committer_holds_uncommitted_saves_to_the_bound(tmp_path, overflow):
    root = tmp_path / "root"
    root.mkdir()
    events = tmp_path / "events-{rank}.jsonl"
    store = LatencyStorage(PosixStorage(str(root), fsync=False), seconds=0.25, key_with="manifest.json")
    worst, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            worst[0] = max(worst[0], _written_uncommitted(root))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ckptio.Checkpointer(store, max_pending=MAX_PENDING, overflow=overflow, keep_last=0, lease_s=0,
                             events_path=str(events), volume_check="off") as ck:
        ck.save(0, {"w": torch.zeros(64, 1024)}).wait(timeout=300)  # the writer is up, its first commit done
        handles = []
        for step in range(1, 13):  # a save every 0.1 s: writes keep up, commits (~0.75 s each) do not
            handles.append(ck.save(step, {"w": torch.full((64, 1024), float(step))}))
            time.sleep(0.1)
        for handle in handles:
            if not handle.skipped:
                handle.wait(timeout=120)
    stop.set()
    sampler.join()
    assert worst[0] <= MAX_PENDING + 1, worst
    committed = set(committed_steps(PosixStorage(str(root))))
    for handle in handles:  # the true outcome: committed ⇔ a manifest, skipped ⇔ none
        assert (handle.step in committed) == (not handle.skipped) and handle.error is None, handle
    assert 12 in committed or overflow == "skip"
    if overflow == "skip":
        assert any(h.skipped for h in handles)  # the slow committer cost saves, not a growing backlog
    records = [json.loads(line) for line in (tmp_path / "events-0.jsonl").read_text().splitlines()]
    behind = [r for r in records if r["event"] == "commit_behind"]
    assert behind and all(r["unfinished"] > MAX_PENDING for r in behind), behind
