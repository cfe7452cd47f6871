"""Several real gloo ranks: a checkpoint saved by 2 ranks (a Shard(0) DTensor, replicated tensors, an object) is
restored by ckptio at 1, 3 and 4 ranks with every byte read from the store once (counted by a storage wrapper;
its records by rank 0 alone), and read by plain ``dcp.load`` at 1, 2 and 3 ranks."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import ckptio
from ckptio.engine.restore.context import RestoreContext
from ckptio.engine.restore.step_restore import restore_step
from ckptio.engine.side_group import SideGroup
from ckptio.storage import open_storage
from ckptio.testing.wrappers import CountingStorage
from tests.engine.engine_workers import model_state, run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

ROWS, COLS = 2048, 1024  # 8 MiB: each rank's shard spans whole and partial 4 MiB checksum blocks


def _full(seed: int) -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(seed))


def _state(world: int, seed: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(seed + 1)
    return {"sharded": distribute_tensor(_full(seed), mesh, [Shard(0)]), "replicated": model_state(seed),
            "big_replicated": torch.randn(1 << 20, generator=g), "info": {"seed": seed}}


def _check(state: dict, seed: int) -> bool:
    expected = _state(dist_world(), seed)
    return (torch.equal(state["sharded"].full_tensor(), _full(seed))
            and all(torch.equal(state["replicated"][k], v) for k, v in expected["replicated"].items())
            and torch.equal(state["big_replicated"], expected["big_replicated"]) and state["info"] == {"seed": seed})


def dist_world() -> int:
    return torch.distributed.get_world_size()


def _blank(world: int) -> dict:
    state = _state(world, seed=0)
    state["sharded"].to_local().zero_()
    state["big_replicated"].zero_()
    state["info"] = {"seed": -1}
    return state


def _save(rank: int, world: int, root: str) -> None:
    with ckptio.Checkpointer(root) as ck:
        ck.save(7, _state(world, seed=5)).wait(timeout=300)


def _restore(rank: int, world: int, root: str, out: str, plain: bool) -> None:
    group = SideGroup()
    counting = CountingStorage(open_storage(root))
    state = _blank(world)
    assert restore_step(RestoreContext(counting, group), state).step == 7
    data = sum(n for key, n in counting.bytes_read.items() if key.endswith(".distcp"))
    records = sorted(key for key in counting.bytes_read if key.endswith((".metadata", "manifest.json")))
    report = {"ok": _check(state, 5), "data_bytes": data, "records": records}
    if plain:  # plain DCP's own reader on the same checkpoint, at this world size
        state = _blank(world)
        dcp.load(state, checkpoint_id=os.path.join(root, "step-00000007"))
        report["dcp_ok"] = _check(state, 5)
    with open(os.path.join(out, f"w{world}-r{rank}.json"), "w") as f:
        json.dump(report, f)


def _plain(rank: int, world: int, root: str, out: str) -> None:
    state = _blank(world)
    dcp.load(state, checkpoint_id=os.path.join(root, "step-00000007"))
    with open(os.path.join(out, f"plain{world}-r{rank}.json"), "w") as f:
        json.dump({"dcp_ok": _check(state, 5)}, f)


def test_restore_at_other_world_sizes_reads_each_byte_once_and_dcp_reads_it_too(root, tmp_path):
    out = str(tmp_path)
    run_ranks(2, _save, root)
    with open(os.path.join(root, "step-00000007", "manifest.json")) as f:
        total = json.load(f)["total_bytes"]
    for world in (1, 3, 4):
        run_ranks(world, _restore, root, out, world != 4)
        reports = []
        for r in range(world):
            with open(os.path.join(out, f"w{world}-r{r}.json")) as f:
                reports.append(json.load(f))
        assert all(rep["ok"] for rep in reports), reports
        assert all(rep.get("dcp_ok", True) for rep in reports), reports
        read = sum(rep["data_bytes"] for rep in reports)
        # Every stored byte is needed by some rank: read exactly once (torch.save's framing between large items
        # is skipped, so a little under the files' bytes), never once per rank that needs it.
        assert 0.99 * total <= read <= total, (world, read, total)
        if world > 1:
            assert all(rep["data_bytes"] > 0 for rep in reports), reports  # the reading is spread
        # The step's records are read once for the job, by rank 0, and broadcast: not once per rank.
        assert reports[0]["records"] == ["step-00000007/.metadata", "step-00000007/manifest.json"], reports
        assert all(rep["records"] == [] for rep in reports[1:]), reports
    run_ranks(2, _plain, root, out)
    for r in range(2):
        with open(os.path.join(out, f"plain2-r{r}.json")) as f:
            assert json.load(f) == {"dcp_ok": True}


def _save_replicated(rank: int, world: int, root: str) -> None:
    with ckptio.Checkpointer(root) as ck:
        ck.save(3, {"shared": torch.arange(1 << 21, dtype=torch.float32)}).wait(timeout=300)  # 8 MiB: two tasks


def _restore_expecting_error(rank: int, world: int, root: str, out: str) -> None:
    from ckptio.errors import ChecksumError

    try:
        restore_step(RestoreContext(open_storage(root), SideGroup()), {"shared": torch.zeros(1 << 21)})
        outcome = {"raised": None}
    except ChecksumError as exc:
        outcome = {"raised": "ChecksumError", "message": str(exc)}
    with open(os.path.join(out, f"err-r{rank}.json"), "w") as f:
        json.dump(outcome, f)


def test_a_corrupt_range_fails_the_restore_on_every_rank_without_a_hang(root, tmp_path):
    run_ranks(1, _save_replicated, root)
    step = os.path.join(root, "step-00000003")
    with open(os.path.join(step, "ranks", "0.json")) as f:
        (item,) = json.load(f)["items"]
    with open(os.path.join(step, item["file"]), "r+b") as f:  # a byte in the second half: the other task reads fine
        f.seek(item["file_offset"] + item["data_offset"] + (6 << 20))
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 1]))
    run_ranks(2, _restore_expecting_error, root, str(tmp_path))
    for r in range(2):
        with open(os.path.join(tmp_path, f"err-r{r}.json")) as f:
            outcome = json.load(f)
        # The rank that read the range names the item and the store; the other names the item and the sender.
        assert outcome["raised"] == "ChecksumError" and "'shared'" in outcome["message"], outcome
