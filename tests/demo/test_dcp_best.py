"""DCP-best, the one implementation the demo and every benchmark measure against: its saves are real DCP checkpoints
(``dcp.load`` reads them back), each waits for the previous one, and its staging wait clears the way for a mutation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptio.testing.ranks import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def _two_saves(rank: int, world_size: int, root: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ckptio.demo.dcp_best import DcpBest

    best = DcpBest(process_group=dist.new_group(backend="gloo"))
    state = {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3)}
    try:
        assert best.done() and best.wait_staged() == 0.0  # nothing in flight yet
        best.save(state, dcp.FileSystemWriter(os.path.join(root, "one")))
        assert best.wait_staged() >= 0.0 and best.staging is None
        state["w"].add_(1.0)  # the staged copy is complete: the live state may change
        best.save(state, dcp.FileSystemWriter(os.path.join(root, "two")))  # waits for "one" to be durable
        best.wait()
        assert best.done() and best.upload is None
    finally:
        best.close()
    for name, offset in (("one", 0.0), ("two", 1.0)):
        loaded = {"w": torch.zeros(4096), "b": torch.zeros(3)}
        dcp.load(loaded, checkpoint_id=os.path.join(root, name))
        assert torch.equal(loaded["w"], torch.arange(4096, dtype=torch.float32) + offset), name
        assert torch.equal(loaded["b"], torch.ones(3)), name


def test_dcp_best_saves_real_checkpoints_one_after_another(tmp_path: Path) -> None:
    run_ranks(1, _two_saves, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
