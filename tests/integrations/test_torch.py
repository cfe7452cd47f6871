"""AppState with plain PyTorch: bit-exact resume, the optimizer pitfalls, several models, FSDP2 on 2 ranks with
per-rank RNG, and plain ``dcp.load`` of what ckptio wrote at another world size."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict
from torchdata.stateful_dataloader import StatefulDataLoader

import ckptio
from ckptio.errors import ConfigError
from ckptio.integrations.torch import AppState
from ckptio.testing.ranks import run_ranks

# torchdata's StatefulDataLoader calls a deprecated torch API on every iterator it creates.
STATEFUL_LOADER = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _draws() -> list[float]:
    return [*torch.rand(2).tolist(), float(np.random.rand()), random.random()]


def _build(seed: int = 0):
    _seed_all(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    data = list(torch.randn(40, 8, generator=torch.Generator().manual_seed(1)))
    loader = StatefulDataLoader(data, batch_size=4, shuffle=True)
    progress = {"step": 0}
    app = AppState(model, optim, sched, extras={"loader": loader, "progress": progress})
    return app, loader, progress


def _train(ck, steps: int, *, save_at=(), restore_step=None):
    """Losses of steps (start, steps]; dropout, torch's and numpy's generators and the loader's shuffling feed the
    loss (python's ``random`` is left out: see test_a_save_leaves_the_python_random_stream_alone)."""
    app, loader, progress = _build()
    model, optim, sched = app.models[0], app.optimizers[0], app.schedulers[0]
    start = 0
    if restore_step is not None:
        start = ck.restore({"app": app}, step=restore_step)
        assert progress["step"] == start
    batches = iter(loader)  # creating an iterator draws from torch's RNG ...
    if restore_step is not None:
        assert app.reapply_rng()  # ... so the restored RNG is set again right before the first step
    losses = {}
    if 0 in save_at:
        ck.save(0, {"app": app}).wait()
    for step in range(start + 1, steps + 1):
        batch = next(batches)
        noise = torch.randn(4, 1) * float(np.random.rand())
        loss = (model(batch) - noise).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        sched.step()
        losses[step] = loss.item()
        progress["step"] = step
        if step in save_at:
            ck.save(step, {"app": app}).wait()
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    """One Checkpointer for the one-process tests (each boots a writer process); tests use distinct steps."""
    with ckptio.Checkpointer(str(tmp_path_factory.mktemp("torch") / "ck"), keep_last=0) as checkpointer:
        yield checkpointer


@STATEFUL_LOADER
def test_resume_is_bit_exact_and_saving_never_changes_training(ck):
    ref_losses, ref_params = _train(ck, 6)
    # Saving (even at step 0, before the optimizer has any state) leaves the run identical.
    saved_losses, _ = _train(ck, 6, save_at=(0, 3))
    assert saved_losses == ref_losses
    resumed_losses, resumed_params = _train(ck, 6, restore_step=3)
    from_zero_losses, _ = _train(ck, 6, restore_step=0)
    assert resumed_losses == {s: ref_losses[s] for s in (4, 5, 6)}
    assert all(torch.equal(a, b) for a, b in zip(resumed_params, ref_params, strict=True))
    # A step-0 checkpoint restores an optimizer that has not stepped yet: training replays exactly.
    assert from_zero_losses == ref_losses


def test_every_generator_round_trips(tmp_path):
    model = torch.nn.Linear(2, 2)
    _seed_all(3)
    expected = _draws()
    _seed_all(3)
    dcp.save({"app": AppState(model)}, checkpoint_id=str(tmp_path))
    _draws()
    app = AppState(model)
    dcp.load({"app": app}, checkpoint_id=str(tmp_path))
    assert _draws() == expected
    _draws()
    assert app.reapply_rng()
    assert _draws() == expected
    assert not AppState(model).reapply_rng()  # nothing restored yet


def test_a_save_leaves_the_python_random_stream_alone(ck):
    random.seed(0)
    expected = random.random()
    random.seed(0)
    ck.save(100, {"app": AppState(torch.nn.Linear(2, 2))}).wait()
    assert random.random() == expected


def test_optimizer_state_is_restored_even_with_gradients_present(tmp_path):
    _seed_all(0)
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        optim.step()
        optim.zero_grad()
    dcp.save({"app": AppState(model, optim)}, checkpoint_id=str(tmp_path))

    fresh = torch.nn.Linear(4, 3)
    fresh_optim = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh(torch.randn(2, 4)).sum().backward()  # a gradient exists and the optimizer has no state yet
    # The pitfall AppState works around: torch's get_state_dict then builds a template with no optimizer state,
    # so a DCP load through it restores nothing into the optimizer, silently.
    assert get_state_dict(fresh, fresh_optim)[1]["state"] == {}
    grad = fresh.weight.grad.clone()
    dcp.load({"app": AppState(fresh, fresh_optim)}, checkpoint_id=str(tmp_path))
    assert torch.equal(fresh_optim.state[fresh.weight]["step"], optim.state[model.weight]["step"])
    assert torch.equal(fresh_optim.state[fresh.weight]["exp_avg"], optim.state[model.weight]["exp_avg"])
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh.weight.grad, grad)  # the caller's gradients are left as they were


def test_several_models_each_with_its_optimizer_and_several_schedulers(tmp_path):
    def parts(seed: int):
        _seed_all(seed)
        # Like pipeline stages: each part keeps the full model's names for the layers it holds.
        stages = [torch.nn.ModuleDict({"l0": torch.nn.Linear(4, 4)}),
                  torch.nn.ModuleDict({"l1": torch.nn.Linear(4, 2)})]
        stages[1].l1.register_module("head", torch.nn.Linear(2, 2))
        optims = [torch.optim.SGD(stages[0].parameters(), lr=0.1, momentum=0.9),
                  torch.optim.Adam(stages[1].parameters(), lr=0.01)]
        scheds = [torch.optim.lr_scheduler.ExponentialLR(o, 0.9) for o in optims]
        return stages, optims, scheds

    stages, optims, scheds = parts(0)
    for _ in range(2):
        stages[1].l1.head(stages[1].l1(stages[0].l0(torch.randn(3, 4)))).sum().backward()
        for o, s in zip(optims, scheds, strict=True):
            o.step()
            o.zero_grad()
            s.step()
    dcp.save({"app": AppState(stages, optims, scheds, rng=False)}, checkpoint_id=str(tmp_path))
    new_stages, new_optims, new_scheds = parts(1)
    dcp.load({"app": AppState(new_stages, new_optims, new_scheds, rng=False)}, checkpoint_id=str(tmp_path))
    for a, b in zip(stages, new_stages, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert torch.equal(new_optims[0].state[new_stages[0].l0.weight]["momentum_buffer"],
                       optims[0].state[stages[0].l0.weight]["momentum_buffer"])
    assert torch.equal(new_optims[1].state[new_stages[1].l1.head.bias]["exp_avg"],
                       optims[1].state[stages[1].l1.head.bias]["exp_avg"])
    assert [s.last_epoch for s in new_scheds] == [2, 2]
    assert new_optims[1].param_groups[0]["lr"] == optims[1].param_groups[0]["lr"]


def test_bad_arguments_are_config_errors():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError):
        AppState(model.weight)
    with pytest.raises(ConfigError):
        AppState(model, optimizer=model)
    with pytest.raises(ConfigError):
        AppState(model, scheduler=object())
    with pytest.raises(ConfigError):
        AppState([model, torch.nn.Linear(2, 2)], [torch.optim.SGD(model.parameters(), lr=0.1)])
    with pytest.raises(ConfigError):
        AppState(model, extras=[1, 2])
    with pytest.raises(ConfigError, match="share parameter names"):
        AppState([model, torch.nn.Linear(2, 2)]).state_dict()


# ---- two ranks: FSDP2, per-rank RNG, resharded loads ----------------------------------------------------------------
def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _fsdp(world_size: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = _mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _two_rank_worker(rank: int, world_size: int, root: str, one_proc_ckpt: str, out: str) -> None:
    # Written by one process, loaded by two: the model and optimizer reshard onto FSDP2; per-rank RNG cannot, since
    # rank 1 has no entry (AppState(rng=True) fails on a missing key, rng=False loads).
    model, optim = _fsdp(world_size)
    with pytest.raises(CheckpointException) as failed:
        dcp.load({"app": AppState(model, optim)}, checkpoint_id=one_proc_ckpt)
    assert "Missing key in checkpoint state_dict: app.ranks.1.rng" in repr(failed.value.failures)
    dcp.load({"app": AppState(model, optim, rng=False)}, checkpoint_id=one_proc_ckpt)
    reloaded = {k: v.full_tensor().tolist() for k, v in model.state_dict().items()}

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(7))
    model(x).sum().backward()
    optim.step()
    optim.zero_grad()
    _seed_all(100 + rank)  # each rank's generators differ
    expected = _draws()
    _seed_all(100 + rank)  # expected: what the generators give right after the capture inside save()
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        ck.save(5, {"app": AppState(model, optim)}).wait()
        _draws()
        new_model, new_optim = _fsdp(world_size)
        assert ck.restore({"app": AppState(new_model, new_optim)}) == 5
        after_restore = _draws()
    same = all(torch.equal(a.full_tensor(), b.full_tensor())
               for a, b in zip(model.state_dict().values(), new_model.state_dict().values(), strict=True))
    full = {k: v.full_tensor().tolist() for k, v in model.state_dict().items()}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"reloaded": reloaded, "expected": expected, "after_restore": after_restore, "same": same,
                   "full": full}, f)


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_rank_fsdp2_per_rank_rng_and_plain_dcp_load_at_other_world_sizes(tmp_path):
    root, out = str(tmp_path / "ck"), str(tmp_path)
    one_proc = str(tmp_path / "one-proc")
    model = _mlp()
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    optim.step()
    dcp.save({"app": AppState(model, optim)}, checkpoint_id=one_proc)

    run_ranks(2, _two_rank_worker, root, one_proc, out)
    ranks = []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    full_one_proc = {k: v.tolist() for k, v in model.state_dict().items()}
    for r in ranks:
        assert r["reloaded"] == full_one_proc
        assert r["same"]
        assert r["after_restore"] == r["expected"]  # each rank got its own generators back
    assert ranks[0]["expected"] != ranks[1]["expected"]

    # Written by two FSDP2 ranks through ckptio, loaded by one plain process with torch's own dcp.load.
    plain = _mlp()
    plain_optim = torch.optim.AdamW(plain.parameters(), lr=0.1)
    dcp.load({"app": AppState(plain, plain_optim)}, checkpoint_id=os.path.join(root, "step-00000005"))
    assert {k: v.tolist() for k, v in plain.state_dict().items()} == ranks[0]["full"]
    assert int(plain_optim.state[plain[0].weight]["step"]) == 2
    assert _draws() == ranks[0]["expected"]  # world size 1 takes rank 0's generators
