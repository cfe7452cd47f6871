"""One process: restore reads tensors straight into their targets, checks every block it uses, and still reads
checkpoints written before block checksums (whole files, as before)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadPlan

import ckptio
from ckptio.engine.restore import destinations as targets
from ckptio.engine.restore.context import RestoreContext
from ckptio.engine.restore.step_restore import restore_step
from ckptio.engine.restore.storage_reader import CkptioStorageReader
from ckptio.engine.side_group import SideGroup
from ckptio.errors import ChecksumError
from ckptio.format import torchsave
from ckptio.format.blocks import BLOCK_SIZE
from ckptio.storage import PosixStorage, open_storage
from ckptio.storage.storage_wrapper import StorageWrapper
from tests.engine.engine_workers import assert_same


def _raw(dtype_name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A tensor of random bit patterns (every value a dtype can hold, NaNs included): compared bit for bit."""
    g = torch.Generator().manual_seed(seed)
    high = 2 if dtype_name == "bool" else 256  # a bool's only bit patterns are 0 and 1 (copies normalise others)
    flat = torch.randint(0, high, (torchsave.nbytes(dtype_name, shape),), dtype=torch.uint8, generator=g)
    return flat.view(getattr(torch, dtype_name)).view(shape)


def _state(seed: int) -> dict:
    state = {f"dtype.{name}": _raw(name, (3, 5), seed) for name in torchsave.DTYPES}
    state.update({
        "scalar": _raw("float32", (), seed),
        "empty": torch.empty(0, 7),
        "straddles": _raw("float32", (BLOCK_SIZE // 4 + 1000,), seed),  # two checksum blocks
        "cast": _raw("float32", (64, 9), seed).clamp(-1e3, 1e3).nan_to_num(),
        "transposed": _raw("float32", (50, 40), seed),
        "meta": {"epoch": seed},
    })
    return state


def _targets() -> dict:
    out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in _state(0).items()}
    out["cast"] = torch.zeros(64, 9, dtype=torch.float64)  # another dtype: streamed with a cast
    out["transposed"] = torch.zeros(40, 50).t()  # non-contiguous: gathered, then copied
    out["meta"] = {"epoch": -1}
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_every_dtype_and_shape_restores_bit_exact_without_torch_load_per_tensor(root, monkeypatch):
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, _state(1)).wait(timeout=120)
        loads: list[object] = []
        real_load = torch.load
        monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
        made: list[str] = []
        real_make = targets.make_dest
        monkeypatch.setattr("ckptio.engine.restore.storage_reader.make_dest",
                            lambda *a, **k: made.append(type(d := real_make(*a, **k)).__name__) or d)
        target = _targets()
        assert ck.restore(target) == 1
    expected = _state(1)
    for key, value in expected.items():
        if key == "cast":
            assert torch.equal(target[key], value.double()), key
        elif isinstance(value, torch.Tensor):
            assert target[key].dtype == value.dtype and torch.equal(_bits(target[key]), _bits(value)), key
    assert target["meta"] == {"epoch": 1}
    assert len(loads) == 1  # the one object; no tensor went through torch.load
    # Every same-dtype contiguous tensor landed in its target's memory (DCP plans no read of an empty tensor).
    assert made.count("DirectDest") == len(torchsave.DTYPES) + 2 and made.count("StreamDest") == 1


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 1]))


def _items(root: str, step: int) -> tuple[str, dict]:
    with open(os.path.join(root, f"step-{step:08d}", "ranks", "0.json")) as f:
        index = json.load(f)
    return index["items"][0]["file"], {i["fqn"]: i for i in index["items"]}


def test_a_flipped_byte_in_the_second_block_names_the_item_and_its_bytes(root):
    state = {"big": _raw("float32", (BLOCK_SIZE // 4 + 1000,), 3)}
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, state).wait(timeout=120)
    name, items = _items(root, 1)
    big = items["big"]
    second = big["file_offset"] + big["data_offset"] + BLOCK_SIZE
    _flip(os.path.join(root, "step-00000001", name), second + 10)
    with ckptio.Checkpointer(root) as ck, pytest.raises(ChecksumError) as info:
        ck.restore({"big": torch.zeros_like(state["big"])})
    assert "'big'" in str(info.value) and f"bytes {second}..{second + 4000}" in str(info.value)
    assert name in str(info.value)


def _strip_block_records(root: str, step: int) -> None:
    """What a checkpoint written before block checksums looks like: items without offsets and blocks."""
    for path in glob.glob(os.path.join(root, f"step-{step:08d}", "ranks", "*.json")):
        with open(path) as f:
            index = json.load(f)
        for item in index["items"]:
            for key in ("data_offset", "data_length", "block_size", "crc32c"):
                item.pop(key)
        with open(path, "w") as f:
            json.dump(index, f)


def test_checkpoints_without_block_checksums_restore_with_whole_file_checks(root):
    state = _state(2)
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, state).wait(timeout=120)
    _strip_block_records(root, 1)
    with ckptio.Checkpointer(root) as ck:
        target = _targets()
        assert ck.restore(target) == 1
    assert_same({k: _bits(v) for k, v in state.items() if k not in ("cast", "meta")},
                {k: _bits(v) for k, v in target.items() if k not in ("cast", "meta")})
    # The whole file is checked now: a flipped byte of torch.save's framing, which no block covers, is found.
    name, items = _items(root, 1)
    _flip(os.path.join(root, "step-00000001", name), items["scalar"]["file_offset"] + 10)
    with ckptio.Checkpointer(root) as ck, pytest.raises(ChecksumError, match=name):
        ck.restore(_targets())


def test_a_stale_rank_index_falls_back_to_whole_file_checks(root):
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, {"w": torch.arange(1000.0)}).wait(timeout=120)
    path = os.path.join(root, "step-00000001", "ranks", "0.json")
    with open(path) as f:
        index = json.load(f)
    index["save_id"] += 1  # another attempt's index: its offsets and blocks are not this save's
    with open(path, "w") as f:
        json.dump(index, f)
    target = {"w": torch.zeros(1000)}
    with ckptio.Checkpointer(root) as ck:
        assert ck.restore(target) == 1
    assert torch.equal(target["w"], torch.arange(1000.0))


_MEMORY = textwrap.dedent("""
    import json, sys, torch
    from ckptio.engine.restore.storage_reader import CkptioStorageReader
    from ckptio.storage import open_storage
    import torch.distributed.checkpoint as dcp
    import warnings
    warnings.simplefilter("ignore")

    def rss(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field))

    target = {"w": torch.empty(int(sys.argv[2]) // 4)}
    target["w"].fill_(0)  # touched: the state's own pages are resident before the restore
    reader = CkptioStorageReader(open_storage(sys.argv[1]), 1, concurrency=2, chunk_bytes=4 << 20)
    reader.read_metadata()
    before = rss("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak RSS, to the current RSS
    dcp.load(target, storage_reader=reader)
    print(json.dumps({"extra": rss("VmHWM:") - before, "ok": bool((target["w"] == 1.5).all())}))
""")


def test_peak_memory_is_bounded_by_concurrency_times_chunk_not_the_file(root):
    size = 160 << 20  # one file, 20x concurrency x chunk
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, {"w": torch.full((size // 4,), 1.5)}).wait(timeout=120)
    (data,) = glob.glob(os.path.join(root, "step-00000001", "*.distcp"))
    assert os.path.getsize(data) > size
    out = subprocess.run([sys.executable, "-c", _MEMORY, root, str(size)], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["ok"]
    # Reads land in the target; bounce buffers (2 x 4 MiB) and O_DIRECT's (8 MiB per reading thread) come on top.
    assert report["extra"] < 48 << 20, report


class _Batching(StorageWrapper):
    """A POSIX store that asks for batched reads, as S3 does; counts its readinto calls."""

    calls = 0

    @property
    def read_batch_bytes(self) -> int:
        return 64 << 20

    def readinto(self, key, buffers, *, offset=0):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return self.inner.readinto(key, buffers, offset=offset)


def test_batched_reads_fetch_adjacent_tensors_together_and_reread_a_bad_one_alone(tmp_path):
    root, local = str(tmp_path / "durable"), str(tmp_path / "local")
    state = {f"t{i}": _raw("float32", (3 << 20,), i) for i in range(4)}  # 12 MiB each: one task per tensor
    with ckptio.Checkpointer(root, local_dir=local) as ck:
        ck.save(1, state).wait(timeout=120)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    assert restore_step(RestoreContext(_Batching(PosixStorage(root)), SideGroup()), target).step == 1
    assert _Batching.calls == 1  # four tensors, one request
    assert all(torch.equal(_bits(target[k]), _bits(v)) for k, v in state.items())
    # The local copy is the first source: a flipped byte in t2 there fails t2's blocks in the batch; t2 alone is
    # then read from every source in turn, and the durable copy is intact.
    name, items = _items(root, 1)  # the local tier keeps the data files only; the durable index says where
    t2 = items["t2"]
    _flip(os.path.join(local, "step-00000001", name), t2["file_offset"] + t2["data_offset"] + 5)
    _Batching.calls = 0
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    ctx = RestoreContext(_Batching(PosixStorage(root)), SideGroup(), local=PosixStorage(local))
    assert restore_step(ctx, target).step == 1
    assert all(torch.equal(_bits(target[k]), _bits(v)) for k, v in state.items())
    assert _Batching.calls == 1  # the durable read of t2 alone


class _RebuildingPlanner(DefaultLoadPlanner):
    """A custom planner that rebuilds its final plan, dropping what the storage reader attached to it."""

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return LoadPlan(list(central_plan.items))


def test_a_planner_that_drops_the_readers_share_still_restores(root):
    state = {"w": _raw("float32", (BLOCK_SIZE // 4 + 7,), 5), "o": {"k": 1}}
    with ckptio.Checkpointer(root) as ck:
        ck.save(1, state).wait(timeout=120)
    target = {"w": torch.zeros_like(state["w"]), "o": {"k": 0}}
    reader = CkptioStorageReader(open_storage(root), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that one process runs without a process group
        dcp.load(target, storage_reader=reader, planner=_RebuildingPlanner())
    assert torch.equal(_bits(target["w"]), _bits(state["w"])) and target["o"] == {"k": 1}
