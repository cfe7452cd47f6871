"""The Hugging Face ``Trainer`` (and Accelerate, as the Trainer drives it) checkpointing through ckptio.

    from ckptio.integrations.hf import CkptioTrainer

    args = TrainingArguments(output_dir="out", save_strategy="steps", save_steps=500, ...)
    trainer = CkptioTrainer(model=model, args=args, train_dataset=ds, checkpointer="/mnt/pfs/run1",
                            checkpointer_options={"local_dir": "/local_nvme/run1", "keep_last": 3})
    trainer.train(resume_from_checkpoint=True)   # newest committed step; a fresh start when there is none

Every time the Trainer would write a ``checkpoint-N`` folder (``save_strategy``/``save_steps``, and at the end of
training), it instead stages one ckptio save of step N: the model and optimizer through ``AppState``
(``get_state_dict``, FQN keys), the LR scheduler, the AMP grad scaler, each rank's RNG states, and ``trainer_state``
(global step, epoch, log history, callback states). ``train(resume_from_checkpoint=True | step)`` goes through the
Trainer's own resume path: it reads ``trainer_state`` first (the Trainer derives the epoch and the batches to skip
from it), loads model/optimizer/scheduler/scaler once the optimizer exists, and sets the RNGs where the Trainer
would (after skipping the batches already trained on).

This module owns that mapping only. It must never write Hugging Face checkpoint folders, never change how the
Trainer trains, and never hide a failed background save: ``train()`` waits for the last save and raises its error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState, TrainerState

from ckptio import Checkpointer
from ckptio.errors import ConfigError
from ckptio.integrations.torch import AppState

if TYPE_CHECKING:
    from ckptio.engine.trainer.staging_guard import StagingGuard

__all__ = ["TRAINER_STATE_KEY", "CkptioTrainer", "CkptioTrainerMixin"]

log = logging.getLogger("ckptio.integrations.hf")

#: the top-level key of the Trainer state (a JSON string, ``TrainerState`` as Hugging Face writes it)
TRAINER_STATE_KEY = "hf_trainer_state"
_APP_KEY = "app"

# The mixin's methods call the Trainer's: type-check them against it without making the mixin a Trainer.
_Base: Any = Trainer if TYPE_CHECKING else object


class CkptioTrainerMixin(_Base):
    """Put before ``Trainer`` (or a subclass such as trl's ``SFTTrainer``) in the bases.

    ``checkpointer`` is a ``ckptio.Checkpointer``, or a root (path or ``s3://`` URL) from which one is built with
    ``checkpointer_options`` once the Trainer has set up ``torch.distributed`` (a Checkpointer built earlier would
    run as a single process). A Checkpointer built here is closed at the end of ``train()``; one passed in is the
    caller's to close.
    """

    def __init__(self, *args: Any, checkpointer: Checkpointer | str | os.PathLike[str],
                 checkpointer_options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ckptio: Checkpointer | None = None
        self._ckptio_spec: tuple[Any, dict[str, Any]] | None = None
        if isinstance(checkpointer, Checkpointer):
            self._ckptio = checkpointer
        elif isinstance(checkpointer, (str, os.PathLike)):
            self._ckptio_spec = (checkpointer, dict(checkpointer_options or {}))
        else:
            raise ConfigError("checkpointer must be a ckptio.Checkpointer or a root, "
                              f"got {type(checkpointer).__name__}")
        self._ckptio_resume: tuple[str, int] | None = None
        self._ckptio_restored: AppState | None = None
        self._ckptio_guard: tuple[Any, StagingGuard] | None = None  # (the optimizer it hooks, the guard)
        _check_args(self)

    @property
    def checkpointer(self) -> Checkpointer:
        if self._ckptio is None:
            assert self._ckptio_spec is not None
            root, options = self._ckptio_spec
            self._ckptio = Checkpointer(root, **options)
        return self._ckptio

    # ---- save ----------------------------------------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Called on every rank where the Trainer would write ``checkpoint-{global_step}``; returns once staged."""
        if self.hp_search_backend is None and trial is None:
            self.store_flos()  # a collective: every rank calls it here, as the Trainer's own save does
        state = {_APP_KEY: self._ckptio_app(), TRAINER_STATE_KEY: self._ckptio_trainer_state_json()}
        self._ckptio_guard_state()
        self.checkpointer.save(self.state.global_step, state)

    def _ckptio_guard_state(self) -> None:
        """save() returns before its copy into staging is done: the next optimizer step (and a forward that changes
        buffers) waits for the copy, not the whole save. Hooked once per optimizer the Trainer builds."""
        optimizer = _torch_optimizer(self.optimizer)
        if self._ckptio_guard is not None and self._ckptio_guard[0] is optimizer:
            return
        self._ckptio_unguard()
        self._ckptio_guard = (optimizer, self.checkpointer.guard(optimizer, self.model))

    def _ckptio_unguard(self) -> None:
        if self._ckptio_guard is not None:
            self._ckptio_guard[1].remove()
            self._ckptio_guard = None

    def _ckptio_app(self) -> AppState:
        extras = {}
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            extras["grad_scaler"] = scaler
        return AppState(self.model, _torch_optimizer(self.optimizer), _torch_scheduler(self.lr_scheduler),
                        extras=extras)

    def _ckptio_trainer_state_json(self) -> str:
        # The callback states, refreshed as the Trainer's own save does before writing trainer_state.json.
        exportable = [cb for cb in [*self.callback_handler.callbacks, self.control] if isinstance(cb, ExportableState)]
        # TrainerState turns a list of ExportableState into its {class name: state} dict, as the Trainer saves it.
        self.state.stateful_callbacks = TrainerState(stateful_callbacks=cast(Any, exportable)).stateful_callbacks
        fields = dataclasses.asdict(self.state)
        # Per-process flags (reset by the Trainer after a load) are normalized so every rank writes the same text:
        # DCP keeps one copy of an object saved under the same key by every rank.
        fields.update(is_local_process_zero=True, is_world_process_zero=True)
        return json.dumps(fields, sort_keys=True)

    # ---- resume --------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | int | None = None, *args: Any, **kwargs: Any) -> Any:
        """``resume_from_checkpoint``: True (newest committed step, or a fresh start when none), a step number, or
        a Hugging Face checkpoint folder (a ``str``: the Trainer's own loading, untouched)."""
        if isinstance(resume_from_checkpoint, str) or resume_from_checkpoint is None or resume_from_checkpoint is False:
            return self._ckptio_finish(super().train(resume_from_checkpoint or None, *args, **kwargs))
        requested = None if resume_from_checkpoint is True else int(resume_from_checkpoint)
        box = {TRAINER_STATE_KEY: ""}
        step = self.checkpointer.restore(box, step=requested)
        if step is None:
            log.info("ckptio: no committed checkpoint to resume from, training from scratch")
            return self._ckptio_finish(super().train(None, *args, **kwargs))
        # The Trainer reads trainer_state.json from the folder it resumes from: give it one holding the restored text.
        folder = tempfile.mkdtemp(prefix=f"ckptio-hf-step{step}-")
        try:
            with open(os.path.join(folder, TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
                f.write(box[TRAINER_STATE_KEY])
            self._ckptio_resume = (folder, step)
            output = super().train(folder, *args, **kwargs)
        finally:
            self._ckptio_resume = None
            self._ckptio_restored = None
            shutil.rmtree(folder, ignore_errors=True)
        return self._ckptio_finish(output)

    def _ckptio_finish(self, output: Any) -> Any:
        """A failed background save surfaces here, at the latest; a Checkpointer built by the mixin is closed."""
        self._ckptio_unguard()
        if self._ckptio is not None:
            if self._ckptio_spec is None:
                self._ckptio.wait()
            else:
                ck, self._ckptio = self._ckptio, None
                try:
                    ck.wait()
                finally:
                    ck.close()
        return output

    def _ckptio_step(self, checkpoint: Any) -> int | None:
        if self._ckptio_resume is not None and checkpoint == self._ckptio_resume[0]:
            return self._ckptio_resume[1]
        return None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        if self._ckptio_step(resume_from_checkpoint) is None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        # else: the weights are restored with the optimizer, once it exists (_load_optimizer_and_scheduler)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        step = self._ckptio_step(checkpoint)
        if step is None:
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        app = self._ckptio_app()
        self.checkpointer.restore({_APP_KEY: app}, step=step)
        self._ckptio_restored = app

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if self._ckptio_step(checkpoint) is None:
            super()._load_rng_state(checkpoint)
        elif self._ckptio_restored is not None:
            # The Trainer calls this after skipping the batches already trained on (whose iterator drew from the
            # RNGs): setting the restored states again here is what makes the next step bit-exact.
            self._ckptio_restored.reapply_rng()


class CkptioTrainer(CkptioTrainerMixin, Trainer):
    """``transformers.Trainer`` whose checkpoints go through ckptio (see ``CkptioTrainerMixin``)."""


def _check_args(trainer: Any) -> None:
    args = trainer.args
    if args.load_best_model_at_end:
        raise ConfigError("load_best_model_at_end needs Hugging Face checkpoint folders; ckptio does not write them")
    if args.save_only_model:
        raise ConfigError("save_only_model is not supported: a ckptio checkpoint always holds the full training state")
    if getattr(trainer, "is_deepspeed_enabled", False):
        raise ConfigError("DeepSpeed checkpoints its own engine state; CkptioTrainer does not support it")
    if args.save_total_limit is not None:
        log.warning("ckptio: save_total_limit is ignored; retention is the Checkpointer's keep_last")


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside Accelerate's wrapper: DCP's state-dict helpers need the real one."""
    from accelerate.optimizer import AcceleratedOptimizer

    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer


def _torch_scheduler(scheduler: Any) -> Any:
    from accelerate.scheduler import AcceleratedScheduler

    return scheduler.scheduler if isinstance(scheduler, AcceleratedScheduler) else scheduler
