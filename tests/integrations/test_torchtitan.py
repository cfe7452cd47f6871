"""torchtitan on ckptio: CkptioCheckpointManager built from its Config the way torchtitan's Trainer builds a
manager, driving torchtitan's own OptimizersContainer, LRSchedulersContainer and ParallelAwareDataloader.

torchtitan's Trainer itself does not import on a CPU-only machine (its MoE kernels import triton), so the loop below
calls the manager as Trainer.train does: load() first, then save(step, last_step=...) after every step.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is published for Python >= 3.11 only")

import torch
import torch.distributed as dist
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, default_adamw

from ckptio.errors import ConfigError
from ckptio.integrations.torchtitan import CkptioCheckpointManager
from ckptio.testing.ranks import run_ranks
from ckptio.testing.staging import hold_staging

STEPS, INTERVAL = 10, 3
STATEFUL_LOADER = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
# torchtitan's LRSchedulersContainer.load_state_dict calls LambdaLR.get_lr() outside step(), which torch warns about.
SCHEDULER_LOAD = pytest.mark.filterwarnings("ignore:To get the last learning rate computed by the scheduler")


class TrainState:
    """The Trainer's own Stateful ({"step", "ntokens_seen"}), which torchtitan hands to the manager."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step = state_dict["step"]


def _job(manager_config, base_folder: str, *, dp_rank: int = 0, dp_world_size: int = 1):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    optim_config = default_adamw(lr=1e-2)
    optim_config.implementation = "for-loop"  # "fused" is CUDA-only
    optimizers = OptimizersContainer(optim_config, model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers, training_steps=STEPS)
    data = list(torch.randn(48 * dp_world_size, 8, generator=torch.Generator().manual_seed(1)))
    shard = data[dp_rank::dp_world_size]
    loader = ParallelAwareDataloader(shard, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=4, shuffle=True,
                                     generator=torch.Generator().manual_seed(2))
    train_state = TrainState()
    manager = manager_config.build(dataloader=loader, model_parts=[model], optimizers=optimizers,
                                   lr_schedulers=schedulers, states={"train_state": train_state}, sd_adapter=None,
                                   base_folder=base_folder)
    return model, optimizers, schedulers, loader, train_state, manager


def _train(manager_config, base_folder: str, *, stop_at: int = STEPS, dp_rank: int = 0, dp_world_size: int = 1,
           hold_s: float = 0.0):
    """Trainer.train's order: load, then a step and save(step, last_step) each iteration, without the Trainer's
    maybe_wait_for_staging() (the manager's guard must cover a loop that leaves it out). ``hold_s``: each save's
    copy into staging starts that late, so an optimizer step that did not wait for it lands in the checkpoint.
    Returns step losses."""
    model, optimizers, schedulers, loader, train_state, manager = _job(manager_config, base_folder, dp_rank=dp_rank,
                                                                       dp_world_size=dp_world_size)
    manager.load()
    losses = {}
    batches = iter(loader)
    while train_state.step < stop_at:
        train_state.step += 1
        x = next(batches)
        loss = (model(x) - x.flip(1)).pow(2).mean()
        loss.backward()
        if dp_world_size > 1:  # data parallel: replicas stay identical
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dp_world_size
        optimizers.step()
        optimizers.zero_grad()
        schedulers.step()
        losses[train_state.step] = loss.item()
        if hold_s and train_state.step % INTERVAL == 0:
            hold_staging(manager.checkpointer, hold_s)
        manager.save(train_state.step, last_step=train_state.step == STEPS)
    manager.close()
    return losses, model, optimizers


def _config(**kw):
    return CkptioCheckpointManager.Config(enable=True, folder="ckpt", interval=INTERVAL, keep_latest_k=0,
                                          last_save_model_only=False, **kw)


@STATEFUL_LOADER
@SCHEDULER_LOAD
def test_resume_through_the_manager_is_bit_exact(tmp_path):
    ref_losses, ref_model, _ = _train(CkptioCheckpointManager.Config(enable=False), str(tmp_path / "ref"))
    base = str(tmp_path / "run")
    # Saves steps 3 and 6, each copied 0.3 s late, while steps 4 and 7 run: a "preemption" after step 7.
    stopped, _, _ = _train(_config(), base, stop_at=7, hold_s=0.3)
    resumed, model, _ = _train(_config(), base)  # loads step 6, replays 7, goes on to 10 (saved as last step)
    assert stopped == {s: ref_losses[s] for s in range(1, 8)}
    assert resumed == {s: ref_losses[s] for s in range(7, STEPS + 1)}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref_model.state_dict().values(),
                                                  strict=True))
    assert {"step-00000003", "step-00000006", "step-00000009", "step-00000010"} <= set(os.listdir(f"{base}/ckpt"))


@STATEFUL_LOADER
def test_maybe_wait_for_staging_returns_once_the_save_is_staged(tmp_path):
    *_, manager = _job(_config(), str(tmp_path))
    try:
        hold_staging(manager.checkpointer, 0.3)
        manager.save(INTERVAL)
        with pytest.raises(TimeoutError):  # launched, not copied yet
            manager.checkpointer.wait_staged(timeout=0)
        manager.maybe_wait_for_staging()  # what torchtitan's Trainer calls before optimizers.step()
        manager.checkpointer.wait_staged(timeout=0)
    finally:
        manager.close()


def test_hugging_face_formats_are_refused():
    with pytest.raises(ConfigError):
        CkptioCheckpointManager.Config(enable=True, last_save_in_hf=True)


def _two_rank_job(rank: int, world_size: int, base: str, out: str) -> None:
    losses, model, _ = _train(_config(), base, stop_at=6, dp_rank=rank, dp_world_size=world_size)
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, os.path.join(out, "model.pt"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(losses, f)


@STATEFUL_LOADER
@SCHEDULER_LOAD
@pytest.mark.multiproc
@pytest.mark.slow
def test_two_rank_checkpoint_loads_in_torchtitans_own_manager_on_one_process(tmp_path):
    base, out = str(tmp_path / "run"), str(tmp_path)
    run_ranks(2, _two_rank_job, base, out)
    step_dir = os.path.join(base, "ckpt", "step-00000006")
    # torchtitan's own DCP manager, pointed at the ckptio step directory as its initial_load_path (plain dcp.load
    # inside), at world size 1; its dataloader state is per data-parallel degree, so it is left out, as torchtitan
    # users do when the degree changes.
    own = CheckpointManager.Config(enable=True, folder="titan", initial_load_path=step_dir,
                                   initial_load_model_only=False, exclude_from_loading=["dataloader"])
    model, optimizers, schedulers, _, train_state, manager = _job(own, str(tmp_path / "one"))
    assert manager.load()
    manager.close()
    expected = torch.load(os.path.join(out, "model.pt"))
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert train_state.step == 6
    assert schedulers.schedulers[0].last_epoch == 6
    assert int(optimizers.optimizers[0].state[model[0].weight]["step"]) == 6
