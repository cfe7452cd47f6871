"""Lightning (``lightning.pytorch``) checkpoints through ckptio: a Callback, resumed by ``trainer.fit(ckpt_path=...)``.

    from ckptio.integrations.lightning import CkptioCheckpoint

    ckpt = CkptioCheckpoint("/mnt/pfs/run1", every_n_train_steps=500, checkpointer_options={"keep_last": 3})
    trainer = L.Trainer(callbacks=[ckpt], strategy="ddp", ...)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt.resume_path())   # newest committed step, or None: fresh

Lightning's own ``CheckpointIO`` is path-based and, under DDP, called on rank 0 only; a ckptio save is a collective
of every rank at a step. So the saving side is a Callback: at the hooks where ``ModelCheckpoint`` saves
(``on_train_batch_end`` every N optimizer steps, ``on_train_epoch_end`` every N epochs) every rank builds Lightning's
own checkpoint dict (the one ``trainer.save_checkpoint`` writes: loops, callbacks, LR schedulers, precision plugin,
hyper-parameters, the user's ``on_save_checkpoint`` additions) and saves, at step ``trainer.global_step``: the model
and optimizers through ``AppState`` (FQN keys, each rank's RNG) and the rest of that dict as one object.

Resuming goes through Lightning's own restore: the Callback wraps the strategy's ``CheckpointIO`` so that paths
``ckptio:<step>`` / ``ckptio:latest`` load from ckptio (every rank loads, collectively); any other path is
passed to the original ``CheckpointIO``. Lightning reads the checkpoint before it creates the optimizers, so the
optimizer states are loaded in ``on_fit_start`` (optimizers exist, Lightning has not restored them yet).

This module owns that mapping. It never writes Lightning ``.ckpt`` files, never saves from rank 0 alone, and supports
only strategies that restore before setting up (single device, DDP): FSDP, DeepSpeed and ModelParallel strategies
manage their own checkpoint formats and are refused with ``ConfigError``.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO

import ckptio
from ckptio import Checkpointer
from ckptio.errors import CheckpointNotFoundError, ConfigError
from ckptio.integrations.torch import AppState

if TYPE_CHECKING:
    from ckptio.engine.trainer.staging_guard import StagingGuard

__all__ = ["LIGHTNING_KEY", "CkptioCheckpoint"]

log = logging.getLogger("ckptio.integrations.lightning")

#: the top-level key of Lightning's checkpoint dict (minus model and optimizer states), one pickled object
LIGHTNING_KEY = "lightning"
_APP_KEY = "app"
_SCHEME = "ckptio:"
_MID_EPOCH = "ckptio_mid_epoch"


def _encode(value: Any) -> bytes:
    # One leaf: the dict's keys depend on the run's callbacks and loops, unknown when a restore builds its template.
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _decode(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)  # this run's own checkpoint, as Lightning loads it


class CkptioCheckpoint(pl.Callback):
    """Save every ``every_n_train_steps`` optimizer steps and/or every ``every_n_epochs`` epochs (default: every
    epoch); resume with ``trainer.fit(..., ckpt_path=CkptioCheckpoint.LATEST | "ckptio:<step>" |
    ckpt.resume_path())``.

    ``checkpointer`` is a root (path or ``s3://`` URL; the Checkpointer is built with ``checkpointer_options`` in
    ``setup``, once Lightning has initialized ``torch.distributed``, and closed at ``teardown``) or a
    ``ckptio.Checkpointer`` built after ``torch.distributed`` is initialized (the caller closes it).
    """

    LATEST = _SCHEME + "latest"

    def __init__(self, checkpointer: Checkpointer | str | os.PathLike[str], *, every_n_train_steps: int | None = None,
                 every_n_epochs: int | None = None, checkpointer_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if isinstance(checkpointer, Checkpointer):
            self._ck: Checkpointer | None = checkpointer
            self._spec: tuple[Any, dict[str, Any]] | None = None
        elif isinstance(checkpointer, (str, os.PathLike)):
            self._ck, self._spec = None, (checkpointer, dict(checkpointer_options or {}))
        else:
            raise ConfigError("checkpointer must be a ckptio.Checkpointer or a root, "
                              f"got {type(checkpointer).__name__}")
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if every_n_train_steps is None and every_n_epochs is None:
            every_n_epochs = 1
        self.every_n_train_steps = every_n_train_steps
        self.every_n_epochs = every_n_epochs
        self._last_saved_step: int | None = None
        self._loaded: dict[str, Any] | None = None  # the dict handed to Lightning, completed in on_fit_start
        self._loaded_step: int | None = None
        self._reapply_rng: AppState | None = None
        self._wrapped: tuple[Any, CheckpointIO] | None = None
        self._guard: StagingGuard | None = None

    @property
    def checkpointer(self) -> Checkpointer:
        if self._ck is None:
            assert self._spec is not None
            root, options = self._spec
            self._ck = Checkpointer(root, **options)
        return self._ck

    def resume_path(self) -> str | None:
        """``ckptio:<step>`` of the newest committed step under the root, or None; for ``trainer.fit(ckpt_path=)``
        in a job script that starts fresh or resumes. Reads the root's listing (no collective): every rank sees the
        same committed steps unless a commit lands while the ranks start."""
        if self._ck is not None:
            step = self._ck.latest_step()
        else:
            assert self._spec is not None
            step = _newest_committed(self._spec[0])
        return None if step is None else f"{_SCHEME}{step}"

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        if strategy.restore_checkpoint_after_setup:
            raise ConfigError(f"CkptioCheckpoint does not support {type(strategy).__name__}: it restores after setup "
                              "with its own checkpoint format (use single-device or DDP strategies)")
        if self._wrapped is None:
            original = strategy.checkpoint_io
            strategy.checkpoint_io = _CkptioIO(original, self, trainer)
            self._wrapped = (strategy, original)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # A load for validate/test/predict leaves its optimizer half unused: it must not leak into a later fit.
        self._loaded = self._loaded_step = None
        self._reapply_rng = None
        self._remove_guard()
        if self._wrapped is not None:
            strategy, original = self._wrapped
            strategy.checkpoint_io = original
            self._wrapped = None
        if self._ck is not None:
            if self._spec is None:
                self._ck.wait()  # a failed background save surfaces at the end of fit, at the latest
            else:
                ck, self._ck = self._ck, None
                try:
                    ck.wait()
                finally:
                    ck.close()

    # ---- save ----------------------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        last_batch = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
        due = self.every_n_train_steps is not None and trainer.global_step % self.every_n_train_steps == 0
        # Step-based training (max_steps): Lightning 2.6 resumes a checkpoint taken in on_train_epoch_end by
        # replaying one batch (its own ModelCheckpoint files included); taken after the epoch's last batch, it
        # resumes exactly. So there, epoch checkpoints are taken here.
        due = due or (last_batch and trainer.max_steps != -1 and self._epoch_due(trainer))
        if due:
            self._save(trainer, mid_epoch=not last_batch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.max_steps == -1 and self._epoch_due(trainer):
            self._save(trainer, mid_epoch=False)

    def _epoch_due(self, trainer: pl.Trainer) -> bool:
        return self.every_n_epochs is not None and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _save(self, trainer: pl.Trainer, *, mid_epoch: bool) -> None:
        step = trainer.global_step
        if trainer.sanity_checking or getattr(trainer, "fast_dev_run", False) or step == self._last_saved_step:
            return  # the same step saved at a batch end and its epoch end: the first one stands, as ModelCheckpoint
        # Lightning's own checkpoint dict, as trainer.save_checkpoint builds it (every rank runs it, as there).
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        checkpoint.pop("state_dict", None)  # both go through AppState instead: FQN keys, reshardable
        checkpoint.pop("optimizer_states", None)
        checkpoint[_MID_EPOCH] = mid_epoch
        app = AppState(trainer.lightning_module, trainer.optimizers)
        self.checkpointer.save(step, {_APP_KEY: app, LIGHTNING_KEY: _encode(checkpoint)})
        self._last_saved_step = step

    # ---- restore -------------------------------------------------------------------------------------------------
    def _load(self, trainer: pl.Trainer, step: int | None) -> dict[str, Any]:
        """Called through Lightning's CheckpointIO on every rank, before the optimizers exist: the model weights and
        Lightning's dict now; the optimizers in on_fit_start."""
        module = trainer.lightning_module
        box: dict[str, Any] = {_APP_KEY: AppState(module, rng=False), LIGHTNING_KEY: b""}
        chosen = self.checkpointer.restore(box, step=step)
        if chosen is None:
            raise CheckpointNotFoundError("no committed checkpoint to resume from (ckpt_path=ckptio:latest); "
                                          "pass ckpt_path=ckpt.resume_path() to start fresh when there is none")
        checkpoint: dict[str, Any] = _decode(box[LIGHTNING_KEY])
        if _finish_epoch_on_resume(checkpoint):
            checkpoint[_MID_EPOCH] = True
        checkpoint["state_dict"] = module.state_dict()  # Lightning loads it again, and hooks see the real weights
        checkpoint["optimizer_states"] = []  # filled in on_fit_start, before Lightning restores the optimizers
        self._loaded, self._loaded_step = checkpoint, chosen
        return checkpoint

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # save() returns before its copy into staging is done: a forward that changes buffers waits for the copy
        # (the guard's hooks), and so does the optimizer's update (on_before_optimizer_step). A step pre-hook would
        # wait too early: Lightning's optimizer.step(closure) runs forward and backward inside it.
        self._remove_guard()
        self._guard = self.checkpointer.guard(model=pl_module)
        if self._loaded is None:
            return
        checkpoint, step = self._loaded, self._loaded_step
        self._loaded = self._loaded_step = None
        app = AppState(trainer.lightning_module, trainer.optimizers)
        self.checkpointer.restore({_APP_KEY: app}, step=step)
        # Lightning restores the optimizers from this dict right after this hook: give it what was just loaded.
        checkpoint["optimizer_states"] = [trainer.strategy.optimizer_state(opt) for opt in trainer.optimizers]
        self._last_saved_step = step
        # The RNGs are set now. Resuming at an epoch boundary, the next random draws are the new epoch's iterator,
        # as in the uninterrupted run. Mid-epoch, building the resumed loader and its iterator draws first: set them
        # again in on_train_start, the first hook after both (before the first batch, or the end of the epoch).
        self._reapply_rng = app if checkpoint.get(_MID_EPOCH) else None

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._guard is not None:
            self._guard.wait()

    def _remove_guard(self) -> None:
        if self._guard is not None:
            self._guard.remove()
            self._guard = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._reapply_rng is not None:
            self._reapply_rng.reapply_rng()
            self._reapply_rng = None


class _CkptioIO(CheckpointIO):
    """The strategy's CheckpointIO, with ``ckptio:`` paths loaded from ckptio; everything else goes to the original."""

    def __init__(self, inner: CheckpointIO, owner: CkptioCheckpoint, trainer: pl.Trainer) -> None:
        self.inner, self.owner, self.trainer = inner, owner, trainer

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        if not text.startswith(_SCHEME):
            extra = {} if weights_only is None else {"weights_only": weights_only}
            return self.inner.load_checkpoint(path, map_location=map_location, **extra)
        which = text[len(_SCHEME):]
        if which != "latest" and not which.isdigit():
            raise ConfigError(f"ckpt_path {text!r}: expected ckptio:latest or ckptio:<step>")
        return self.owner._load(self.trainer, None if which == "latest" else int(which))

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


def _finish_epoch_on_resume(checkpoint: dict[str, Any]) -> bool:
    """Make a checkpoint taken after an epoch's last batch, with the loader's position in it, resume as the
    uninterrupted run went on: end that epoch, then start the next. True when it changed the loops' state.

    Lightning 2.6 restores such a checkpoint (``every_n_train_steps`` landing on the last batch) by counting the
    epoch as finished and then running the rest of it from the restored loader, which is exhausted: an empty epoch
    whose end counts again, so ``current_epoch`` is one ahead, ``on_train_epoch_start`` of the next epoch is
    skipped and its iterator is created later than in the run that saved (its own ``ModelCheckpoint`` files
    resume the same way). Resumed as "the last batch is done, the epoch is not over", the empty rest of the epoch
    ends it once, with its hooks, and the next epoch starts as in that run. A loader without saved state starts a
    fresh iterator either way; Lightning's own path is right for it and is left alone."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit_loop.get("epoch_loop.batch_progress")
    if not progress or not progress.get("is_last_batch") or not fit_loop.get("state_dict", {}).get("combined_loader"):
        return False
    total = progress["total"]
    if total["completed"] != total["processed"] - 1:  # not taken in on_train_batch_end
        return False
    progress["is_last_batch"] = False
    return True


def _newest_committed(root: Any) -> int | None:
    """The newest step with a manifest (the commit, per the documented layout ``<root>/step-%08d/manifest.json``)."""
    storage = ckptio.open_storage(root)
    try:
        steps = [int(name[len("step-"):]) for name in storage.list_dirs("")
                 if name.startswith("step-") and name[len("step-"):].isdigit()
                 and storage.exists(f"{name}/manifest.json")]
    finally:
        storage.close()
    return max(steps) if steps else None
