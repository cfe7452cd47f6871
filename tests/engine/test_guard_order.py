"""The staging guard's hooks run before the module's and the optimizer's other pre-hooks, so a pre-hook that itself
mutates the saved state (spectral_norm's power iteration, a user's in-place update) waits for the copy too.

Each save's copy is held back (``hold_staging``) while the next step runs: a hook that runs before the guard's
then always lands in the saved step.
"""

from __future__ import annotations

from typing import Any

import torch

import ckptio
from ckptio.testing.staging import hold_staging


def _saved(root: str, expected: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    target = {"model": {k: torch.zeros_like(v) for k, v in expected.items()}}
    with ckptio.Checkpointer(root, start_writer="on_first_save") as ck:
        assert ck.restore(target, step=step) == step
    return target["model"]


def _loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def test_spectral_norms_forward_pre_hook_runs_after_the_guard_waits(root):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.utils.spectral_norm(torch.nn.Linear(64, 64)), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 64)
    with ckptio.Checkpointer(root, fsync=False) as ck, ck.guard(opt, model):  # guarded after spectral_norm's hook
        _loss(model, x).backward()
        opt.step()
        opt.zero_grad()
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        hold_staging(ck, 0.5)
        handle = ck.save(1, {"model": model.state_dict()})
        _loss(model, x).backward()  # training mode: spectral_norm updates weight_u/weight_v in place first thing
        handle.wait(timeout=120)
    assert not torch.equal(model[0].weight_u, expected["0.weight_u"]), "the forward did not move weight_u"
    saved = _saved(root, expected, 1)
    for key in ("0.weight_u", "0.weight_v", "0.weight_orig"):
        assert torch.equal(saved[key], expected[key]), f"{key} holds the next step's value"


def test_an_optimizer_step_pre_hook_registered_earlier_runs_after_the_guard_waits(root):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def decay_in_place(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.mul_(0.5)

    opt.register_step_pre_hook(decay_in_place)
    x = torch.randn(4, 32)
    with ckptio.Checkpointer(root, fsync=False) as ck, ck.guard(opt, model):
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        _loss(model, x).backward()
        hold_staging(ck, 0.5)
        handle = ck.save(1, {"model": model.state_dict()})
        opt.step()
        handle.wait(timeout=120)
    assert not torch.equal(model.weight, expected["weight"])
    saved = _saved(root, expected, 1)
    assert all(torch.equal(saved[k], expected[k]) for k in expected), "the decay hook ran before the guard's"
