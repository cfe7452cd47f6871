"""A minimal training loop with ckptio: run it as one process, or with `torchrun --nproc-per-node 2`.

    python examples/train_with_ckptio.py /tmp/ckpt-example
    torchrun --nproc-per-node 2 examples/train_with_ckptio.py /tmp/ckpt-example

Run it twice: the second run resumes from the newest committed step.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ckptio
from ckptio.integrations.torch import AppState


def main(root: str, steps: int = 30) -> None:
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    # Under torchrun, DDP keeps the replicas identical (DCP keeps one copy of a tensor every rank saves).
    forward = DistributedDataParallel(model) if dist.is_initialized() else model
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=1000)
    progress = {"step": 0}
    # nn.Module and Optimizer are Stateful already, but an Optimizer's own state_dict() is keyed by parameter index
    # (it does not reshard) and, before the first step, has no state tensors: DCP would have nothing to load the
    # saved moments into. AppState goes through torch.distributed.checkpoint.state_dict (FQN keys, optimizer state
    # created before a restore) and adds the scheduler, each rank's RNG states and `progress`.
    app = AppState(model, optim, sched, extras={"progress": progress})
    # save() returns before its copy into the staging slot is done: the guard makes optim.step() (and a forward
    # that changes buffers) wait for that copy, so the next step's forward and backward overlap it.
    with ckptio.Checkpointer(root, every_steps=10, keep_last=2) as ck, ck.guard(optim, model):
        start = (ck.restore({"app": app}) or 0) + 1  # restores `progress` in place too
        for step in range(start, start + steps):
            with ck.step_timer(step):
                x = torch.randn(32, 64)
                loss = (forward(x) - x).pow(2).mean()
                loss.backward()
                optim.step()
                optim.zero_grad()
                sched.step()
            progress["step"] = step
            if ck.maybe_save(step, {"app": app}) is not None and (not dist.is_initialized() or dist.get_rank() == 0):
                print(f"step {step}: loss {loss.item():.4f}, checkpoint launched")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ckpt-example")
