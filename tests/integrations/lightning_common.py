"""A tiny Lightning job, uninterrupted, stopped after a checkpoint, and resumed from it, for a mid-epoch and an
epoch-end checkpoint; shared by the one-process test and the torchrun worker."""

from __future__ import annotations

import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ckptio.integrations.lightning import CkptioCheckpoint
from ckptio.testing.staging import hold_staging

MAX_STEPS, MID_EPOCH, EPOCH_END = 10, 4, 6  # 6 batches per epoch per rank


class TinyModule(pl.LightningModule):
    def __init__(self, world_size: int, loader: str = "stateful") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.world_size = world_size
        self.loader = loader
        self.losses: dict[int, float] = {}
        self.epochs: dict[int, int] = {}  # the epoch each step trained in: a resume must not skip or repeat one

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = (self.net(x) - y).pow(2).mean()
        self.losses[self.global_step + 1] = loss.item()
        self.epochs[self.global_step + 1] = self.current_epoch
        return loss

    def configure_optimizers(self) -> Any:
        optim = torch.optim.AdamW(self.parameters(), lr=1e-2)
        # Lightning steps it once per epoch: its position is part of what resumes.
        return {"optimizer": optim, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.5)}

    def train_dataloader(self) -> StatefulDataLoader:
        g = torch.Generator().manual_seed(1)
        n = 24 * self.world_size
        data = TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))
        # An epoch's order from (seed, epoch) alone, as with the sampler Lightning puts in under DDP.
        sampler = DistributedSampler(data, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank,
                                     shuffle=True, seed=2)
        if self.loader == "stateful" and self.world_size == 1:
            # Resumable: Lightning restores its position from a mid-epoch checkpoint. Its sampler draws its seed
            # from torch's global RNG, when built and at each new iterator (the RNGs are set again before the first
            # resumed batch).
            return StatefulDataLoader(data, batch_size=4, shuffle=True)
        if self.loader == "stateful":
            # Under DDP, the loader's own DistributedSampler: with one Lightning puts in, the loader's position does
            # not resume (see docs/integrations.md).
            return StatefulDataLoader(data, batch_size=4, sampler=sampler)
        return DataLoader(data, batch_size=4, sampler=sampler)


class _Stop(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


class _HoldStaging(pl.Callback):
    """Before the checkpoint of step ``step`` (listed before CkptioCheckpoint, so its hook runs first): its copy
    into staging starts 0.3 s late, while the next step runs, and the parameters as saved are kept to compare."""

    def __init__(self, ck: Any, step: int) -> None:
        self.ck, self.step = ck, step
        self.params: dict[str, torch.Tensor] = {}

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step:
            hold_staging(self.ck, 0.3)
            self.params = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


def fit(world_size: int, out_dir: str, callbacks: list[pl.Callback], *, ckpt_path: str | None = None,
        loader: str = "stateful", max_epochs: int | None = None) -> TinyModule:
    module = TinyModule(world_size, loader)
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, strategy="ddp" if world_size > 1 else "auto",
        max_steps=-1 if max_epochs else MAX_STEPS, max_epochs=max_epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=out_dir, callbacks=callbacks,
    )
    with warnings.catch_warnings():
        # A 4-sample batch from one process: Lightning suggests more loader workers; torchdata warns on iterators.
        warnings.filterwarnings("ignore", message=".*does not have many workers")
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        # Lightning 2.6 on torch 2.13 builds a LeafSpec, deprecated there.
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
        trainer.fit(module, ckpt_path=ckpt_path)
    return module


def _same(a: TinyModule, b: TinyModule) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


CASES = {
    # case: (loader, max_epochs, stop at step, saving callback, resuming callback); 6 batches per epoch per rank
    "mid_epoch": ("stateful", None, MID_EPOCH, {"every_n_train_steps": MID_EPOCH}, {"every_n_train_steps": MID_EPOCH}),
    "epoch_end": ("epoch_seeded", None, EPOCH_END, {"every_n_epochs": 1}, {"every_n_epochs": 1000}),
    "epoch_based": ("epoch_seeded", 3, 2 * EPOCH_END, {"every_n_epochs": 2}, {"every_n_epochs": 1000}),
    # every_n_train_steps landing on an epoch's last batch, with a resumable loader (a root of its own: the
    # epoch_end case saves the same step)
    "last_batch": ("stateful", None, EPOCH_END, {"every_n_train_steps": EPOCH_END},
                   {"every_n_train_steps": EPOCH_END}),
}
DEFAULT_CASES = ("mid_epoch", "epoch_end", "epoch_based")


def resume_runs(ck: Any, out_dir: str, world_size: int = 1, cases: tuple[str, ...] = DEFAULT_CASES) -> dict[str, Any]:
    """Each case: uninterrupted, stopped one step after a checkpoint, resumed from it. A mid-epoch checkpoint needs a
    resumable loader (StatefulDataLoader); an epoch-end one, an epoch-seeded sampler (as Lightning's under DDP)."""
    out: dict[str, Any] = {}
    for case in cases:
        loader, max_epochs, stop, saving, resuming = CASES[case]
        kw = {"loader": loader, "max_epochs": max_epochs}
        ref = fit(world_size, out_dir, [], **kw)
        # Stopped one step after the checkpoint, whose copy into staging is held back while that step runs.
        hold = _HoldStaging(ck, stop)
        stopped = fit(world_size, out_dir, [hold, CkptioCheckpoint(ck, **saving), _Stop(stop + 1)], **kw)
        resumed = fit(world_size, out_dir, [CkptioCheckpoint(ck, **resuming)], ckpt_path=f"ckptio:{stop}", **kw)
        out[case] = {"ref": ref.losses, "stopped": stopped.losses, "resumed": resumed.losses,
                     "ref_epochs": ref.epochs, "resumed_epochs": resumed.epochs, "same_params": _same(ref, resumed)}
        if case == "epoch_end":
            out["stopped_params"] = hold.params
    out["newest"] = CkptioCheckpoint(ck).resume_path()
    return out
