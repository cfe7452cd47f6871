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

import ckptio


def main(root: str, steps: int = 30) -> None:
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    progress = {"step": 0}
    # nn.Module and Optimizer are not Stateful by themselves: checkpoint their state dicts.
    app = {"model": model.state_dict(), "optim": optim.state_dict(), "progress": progress}
    with ckptio.Checkpointer(root, every_steps=10, keep_last=2) as ck:
        restored = ck.restore(app)
        if restored is not None:
            model.load_state_dict(app["model"])
            optim.load_state_dict(app["optim"])
        start = (restored or 0) + 1
        for step in range(start, start + steps):
            with ck.step_timer(step):
                x = torch.randn(32, 64)
                loss = (model(x) - x).pow(2).mean()
                loss.backward()
                optim.step()
                optim.zero_grad()
            progress["step"] = step
            app = {"model": model.state_dict(), "optim": optim.state_dict(), "progress": progress}
            if ck.maybe_save(step, app) is not None and (not dist.is_initialized() or dist.get_rank() == 0):
                print(f"step {step}: loss {loss.item():.4f}, checkpoint staged")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ckpt-example")
