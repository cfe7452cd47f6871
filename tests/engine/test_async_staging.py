"""Async staging: save() returns before the copy; the guard keeps every saved step exactly the pre-mutation state;
wait_staged waits, raises staging errors and times out; the CPU path never touches torch.cuda."""

from __future__ import annotations

import copy
import logging
import random
import threading

import pytest
import torch

import ckptio
from ckptio.engine.trainer.stager import split_by_device
from ckptio.engine.trainer.staging_area import StagingSlot
from ckptio.engine.trainer.staging_guard import mutated_in_forward
from ckptio.errors import UnsupportedStateError
from tests.engine.engine_workers import assert_same


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.BatchNorm1d(1024), torch.nn.Linear(1024, 512))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    # forward mutates BatchNorm's running stats; step mutates parameters and Adam's moments and step counters.
    model(torch.randn(16, 512)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _zeroed(state):
    target = copy.deepcopy(state)

    def zero(x):
        if isinstance(x, torch.Tensor):
            x.zero_()
        elif isinstance(x, dict):
            for v in x.values():
                zero(v)
        elif isinstance(x, list):
            for v in x:
                zero(v)

    zero(target)
    return target


def test_with_the_guard_each_saved_step_is_exactly_the_state_at_save(root):
    """Mutate right after save() returns (random timing, many saves): the guard's hooks hold the first mutation
    until the copy is done, so every step restores to the copy taken before its mutation."""
    model, opt = _model()
    _train_step(model, opt)
    rng = random.Random(1)
    expected = {}
    with ckptio.Checkpointer(root, keep_last=0, max_pending=2, fsync=False) as ck, ck.guard(opt, model):
        for step in range(1, 11):
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            handle = ck.save(step, state)
            expected[step] = copy.deepcopy(state)  # read only: taken while the copy may still run
            if rng.random() < 0.5:
                threading.Event().wait(rng.random() * 0.003)
            _train_step(model, opt)  # the first mutation: the hooks wait for staging here
            assert handle.staged() or handle.skipped
        ck.wait()
        for step, state in expected.items():
            target = _zeroed(state)
            assert ck.restore(target, step=step) == step
            assert_same(target, state, f"step {step}")


def test_save_returns_before_the_copy_and_wait_staged_then_allows_mutation(root):
    state = {"w": torch.full((1024, 1024), 1.0)}
    with ckptio.Checkpointer(root, fsync=False) as ck:
        ck.save(1, {"w": torch.zeros(4)}).wait()  # plan and boot the writer first
        gate = threading.Event()
        ck._stager._put(gate.wait)  # hold the staging thread (the real thread, only its timing is forced)
        h = ck.save(2, {"w": state["w"]})
        assert not h.staged(), "save() must return before the copy runs"
        with pytest.raises(TimeoutError):
            h.wait_staged(timeout=0.05)
        with pytest.raises(TimeoutError):
            ck.wait_staged(timeout=0.05)
        gate.set()
        h.wait_staged(timeout=60)
        assert h.staged()
        state["w"].fill_(2.0)
        h.wait(timeout=120)
        target = {"w": torch.zeros(1024, 1024)}
        ck.restore(target)
    assert torch.equal(target["w"], torch.full((1024, 1024), 1.0))


class _FailingCopy(torch.Tensor):
    """A tensor subclass (as DTensor or float8 tensors are) whose copy fails once ``FAIL`` is set: a real copy
    error raised on the staging thread."""

    FAIL = threading.Event()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if cls.FAIL.is_set() and func is torch._foreach_copy_:
            raise RuntimeError("device lost")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_staging_error_surfaces_on_the_next_save_wait_staged_and_wait(root, caplog):
    w = torch.ones(256, 256).as_subclass(_FailingCopy)
    with ckptio.Checkpointer(root, fsync=False) as ck:
        ck.save(1, {"w": w}).wait()
        _FailingCopy.FAIL.set()
        try:
            h = ck.save(2, {"w": w})
            assert h.wait_done(timeout=60)  # completed, not reported yet
        finally:
            _FailingCopy.FAIL.clear()
        with caplog.at_level(logging.WARNING, logger="ckptio"):
            ck.save(3, {"w": w}).wait(timeout=120)
        assert any("an earlier save failed" in r.message and "device lost" in r.message for r in caplog.records)
        with pytest.raises(UnsupportedStateError, match="staging slot failed: RuntimeError: device lost"):
            h.wait_staged(timeout=60)
        with pytest.raises(UnsupportedStateError):
            h.wait(timeout=60)
        with pytest.raises(UnsupportedStateError):
            ck.wait_staged()
        ck.wait_staged()  # raised once
        assert h.error.step == 2 and h.error.rank == 0
        assert ck.latest_step() == 3


def test_sync_staging_raises_a_staging_error_from_save(root):
    w = torch.ones(64).as_subclass(_FailingCopy)
    with ckptio.Checkpointer(root, staging="sync", fsync=False) as ck:
        ck.save(1, {"w": w}).wait()
        _FailingCopy.FAIL.set()
        try:
            with pytest.raises(UnsupportedStateError, match="device lost"):
                ck.save(2, {"w": w})
        finally:
            _FailingCopy.FAIL.clear()
        ck.save(3, {"w": w}).wait(timeout=120)


def test_sync_staging_copies_inside_save(root):
    with ckptio.Checkpointer(root, staging="sync", fsync=False) as ck:
        h = ck.save(1, {"w": torch.ones(8)})
        assert h.staged()
        h.wait(timeout=120)


def test_the_cpu_path_never_touches_torch_cuda(root, monkeypatch):
    """No GPU here: any call into torch.cuda on the CPU path fails the test (the CUDA path itself is exercised by
    bench/gpu_check.py on a GPU)."""
    def forbidden(*_a, **_k):
        raise AssertionError("torch.cuda touched on the CPU staging path")

    for name in ("Stream", "Event", "current_stream", "stream", "synchronize", "is_available", "cudart"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    model, opt = _model()
    with ckptio.Checkpointer(root, fsync=False) as ck, ck.guard(opt, model):
        _train_step(model, opt)
        h = ck.save(1, {"model": model.state_dict(), "optim": opt.state_dict()})
        _train_step(model, opt)
        ck.wait_staged()
        h.wait(timeout=120)


def test_split_by_device_and_the_modules_the_guard_hooks(tmp_path):
    slot = StagingSlot(0, 64, str(tmp_path))
    try:
        slot.views = [slot.base[:32].view(torch.float32), slot.base[32:].view(torch.float32)]
        (_cpu_dst, cpu_src), (cuda_dst, cuda_src) = split_by_device(slot, [torch.ones(8), torch.ones(8)])
        assert len(cpu_src) == 2 and not cuda_src and not cuda_dst
    finally:
        slot.close()
    model, _ = _model()
    hooked = mutated_in_forward(model)
    assert [type(m) for m in hooked] == [torch.nn.BatchNorm1d]


def test_guard_remove_takes_the_hooks_off(root):
    model, opt = _model()
    with ckptio.Checkpointer(root, fsync=False) as ck:
        guard = ck.guard(opt, model)
        assert opt._optimizer_step_pre_hooks and model[1]._forward_pre_hooks
        guard.remove()
        assert not opt._optimizer_step_pre_hooks and not model[1]._forward_pre_hooks


@pytest.mark.parametrize("staging", ["async", "sync"])
def test_a_save_is_with_the_writer_before_wait_staged_returns(tmp_path, staging):
    # wait_staged's contract: once staged, the save is the writer's, so a trainer killed right after still ends in a
    # commit or a failure marker. Marking it staged before the message was sent left a window in which a SIGTERM
    # lost the save without a trace (tests/engine/test_signals.py caught it once the writer ran at nice 0).
    with ckptio.Checkpointer(str(tmp_path), staging=staging, volume_check="off") as ck:
        seen: list[bool] = []
        submit = ck._writer.submit

        def spy(message):
            handle = ck._tracker._pending.get(getattr(message, "save_id", None))
            if handle is not None:
                seen.append(handle.staged())
            submit(message)

        ck._writer.submit = spy
        ck.save(1, {"w": torch.ones(1 << 16)}).wait_staged()
        assert seen == [False]  # the message went before the handle said staged
        ck.wait(timeout=120)
