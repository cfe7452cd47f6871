"""One process: save → restore round trips of every kind of value DCP accepts."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
from ckptio import format as fmt
from ckptio.storage import PosixStorage
from tests.engine.engine_workers import assert_same


@dataclasses.dataclass
class RunInfo:
    name: str
    seen: list[int]


def _train_one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    model(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def _full_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "tensors": {
            "f32": torch.randn(5, 7, generator=g),
            "f16": torch.randn(3, generator=g).half(),
            "bf16": torch.randn(4, 4, generator=g).bfloat16(),
            "i64": torch.arange(10),
            "i8": torch.tensor([-3, 4, 5], dtype=torch.int8),
            "bool": torch.tensor([True, False, True]),
            "scalar": torch.tensor(3.25),
            "empty": torch.empty(0, 3),
            "noncontig": torch.randn(6, 4, generator=g).t(),
            "view": torch.arange(100.0)[10:20],
        },
        "list": [torch.ones(2), {"nested": torch.zeros(3)}, 7],
        "int": 41,
        "float": 2.5,
        "str": "hello",
        "none": None,
        "obj": RunInfo(name="run1", seen=[1, 2, 3]),
    }


def _zeros_like(state):
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: _zeros_like(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_zeros_like(v) for v in state]
    return None if not isinstance(state, (int, float, str, RunInfo)) else type(state).__new__(type(state)) \
        if isinstance(state, RunInfo) else type(state)()


def test_every_kind_of_value_round_trips(root):
    state = _full_state()
    # A class of the user's own is restored only when allowlisted (docs/security.md).
    with ckptio.Checkpointer(root, safe_globals=[RunInfo]) as ck:
        h = ck.save(10, state)
        assert not h.skipped
        h.wait(timeout=120)
        assert h.done()
        target = _zeros_like(state)
        target["obj"] = None
        assert ck.restore(target) == 10
    expected = _full_state()
    assert_same(expected["tensors"], target["tensors"], "tensors")
    assert_same(expected["list"], target["list"], "list")
    for key in ("int", "float", "str", "none", "obj"):
        assert target[key] == expected[key], key


def test_stateful_model_and_optimizer_round_trip(root):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train_one_step(model, opt, 1)

    class App:  # a Stateful: DCP calls state_dict()/load_state_dict()
        def __init__(self, m, o):
            self.m, self.o = m, o

        def state_dict(self):
            return {"model": self.m.state_dict(), "optim": self.o.state_dict()}

        def load_state_dict(self, sd):
            self.m.load_state_dict(sd["model"])
            self.o.load_state_dict(sd["optim"])

    with ckptio.Checkpointer(root) as ck:
        ck.save(1, {"app": App(model, opt)}).wait(timeout=120)
        # Continue the original; a copy restored from step 1 must follow the same trajectory bit-exactly.
        torch.manual_seed(1)
        model2 = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        _train_one_step(model2, opt2, 99)  # materialise optimizer state so shapes exist
        assert ck.restore({"app": App(model2, opt2)}) == 1
    _train_one_step(model, opt, 2)
    _train_one_step(model2, opt2, 2)
    assert_same(model.state_dict(), model2.state_dict(), "model")


def test_plain_dcp_load_reads_a_ckptio_checkpoint(root):
    state = {"w": torch.randn(64, 64), "meta": {"step": 3}}
    with ckptio.Checkpointer(root) as ck:
        ck.save(3, state).wait(timeout=120)
    target = {"w": torch.zeros(64, 64), "meta": {"step": 0}}
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(target, checkpoint_id=os.path.join(root, "step-00000003"))
    assert torch.equal(target["w"], state["w"])
    assert target["meta"]["step"] == 3


def test_state_can_be_mutated_right_after_save_returns_with_sync_staging(root):
    state = {"w": torch.full((256, 256), 1.0)}
    with ckptio.Checkpointer(root, staging="sync") as ck:
        h = ck.save(1, state)
        assert h.staged()
        state["w"].fill_(2.0)  # the snapshot was taken before save() returned
        h.wait(timeout=120)
        target = {"w": torch.zeros(256, 256)}
        ck.restore(target)
    assert torch.equal(target["w"], torch.full((256, 256), 1.0))


def test_maybe_save_every_steps_and_every_seconds(root):
    state = {"w": torch.ones(4)}
    with ckptio.Checkpointer(root, every_steps=3, keep_last=0) as ck:
        saved = [s for s in range(1, 10) if ck.maybe_save(s, state) is not None]
        ck.wait()
        assert saved == [3, 6, 9]
        assert fmt.committed_steps(PosixStorage(root)) == [3, 6, 9]
    with ckptio.Checkpointer(root, every_seconds=3600, keep_last=0) as ck:
        assert ck.maybe_save(10, state) is None  # an hour has not passed since start
    with ckptio.Checkpointer(root, every_seconds=1e-6, keep_last=0) as ck:
        h = ck.maybe_save(11, state)
        assert h is not None
        h.wait(timeout=120)
