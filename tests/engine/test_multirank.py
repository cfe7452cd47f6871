"""Several real gloo ranks: save on 4, restore on 4, plain ``dcp.load`` on 2 with DTensor resharding."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import ckptio
from tests.engine.engine_workers import model_state, run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

FULL_ROWS, COLS = 64, 24


def _full(seed: int) -> torch.Tensor:
    return torch.randn(FULL_ROWS, COLS, generator=torch.Generator().manual_seed(seed))


def _sharded_state(world_size: int, seed: int) -> dict:
    mesh = init_device_mesh("cpu", (world_size,))
    return {
        "sharded": distribute_tensor(_full(seed), mesh, [Shard(0)]),
        "replicated": model_state(seed),
        "step_info": {"seed": seed},
    }


def _save_on_ranks(rank: int, world_size: int, root: str, out: str) -> None:
    state = _sharded_state(world_size, seed=5)
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        h = ck.save(100, state)
        h.wait(timeout=300)
        # Overwrite everything, then restore on the same world size.
        state["sharded"].to_local().zero_()
        for t in state["replicated"].values():
            t.zero_()
        state["step_info"]["seed"] = -1
        assert ck.restore(state) == 100
    ok = torch.equal(state["sharded"].full_tensor(), _full(5)) and all(
        torch.equal(a, b) for a, b in zip(state["replicated"].values(), model_state(5).values(), strict=True)
    )
    with open(os.path.join(out, f"save{rank}.json"), "w") as f:
        json.dump({"ok": ok, "seed": state["step_info"]["seed"]}, f)


def _dcp_load_on_ranks(rank: int, world_size: int, root: str, out: str) -> None:
    state = _sharded_state(world_size, seed=0)  # different values, resharded layout
    state["sharded"].to_local().zero_()
    dcp.load(state, checkpoint_id=os.path.join(root, "step-00000100"))
    ok = torch.equal(state["sharded"].full_tensor(), _full(5)) and all(
        torch.equal(a, b) for a, b in zip(state["replicated"].values(), model_state(5).values(), strict=True)
    )
    with open(os.path.join(out, f"load{rank}.json"), "w") as f:
        json.dump({"ok": ok, "local_rows": state["sharded"].to_local().shape[0],
                   "seed": state["step_info"]["seed"]}, f)


def test_four_ranks_save_restore_and_dcp_reshard_to_two(root, tmp_path):
    out = str(tmp_path)
    run_ranks(4, _save_on_ranks, root, out)
    for r in range(4):
        with open(os.path.join(out, f"save{r}.json")) as f:
            assert json.load(f) == {"ok": True, "seed": 5}
    step_dir = os.path.join(root, "step-00000100")
    names = set(os.listdir(step_dir))
    assert {"manifest.json", ".metadata"} <= names
    assert sorted(os.listdir(os.path.join(step_dir, "ranks"))) == [f"{r}.json" for r in range(4)]
    # Replicated tensors are written once (DCP de-duplication), not four times.
    with open(os.path.join(step_dir, "manifest.json"), "rb") as f:
        manifest = json.load(f)
    shard_bytes = FULL_ROWS * COLS * 4
    replicated_bytes = sum(t.nbytes for t in model_state(5).values())
    assert manifest["total_bytes"] < shard_bytes + 2 * replicated_bytes + 64 * 1024

    run_ranks(2, _dcp_load_on_ranks, root, out)
    for r in range(2):
        with open(os.path.join(out, f"load{r}.json")) as f:
            assert json.load(f) == {"ok": True, "local_rows": FULL_ROWS // 2, "seed": 5}
