"""A torchtitan checkpoint manager backed by ckptio: ``CkptioCheckpointManager``.

torchtitan's Trainer builds its checkpoint manager from ``config.checkpoint`` (any ``BaseCheckpointManager.Config``)
and calls ``load(step)`` before training, ``save(step, last_step=...)`` after every step, and ``close()``. Pointing
``checkpoint`` at this manager's Config is the whole change; no torchtitan code is patched::

    from ckptio.integrations.torchtitan import CkptioCheckpointManager

    config.checkpoint = CkptioCheckpointManager.Config(enable=True, interval=500, keep_latest_k=3,
                                                       local_dir="/local_nvme/ckpt")

It saves exactly the state torchtitan's own (DCP) manager saves, with the same keys: the model's FQNs flattened to the
top level, ``optimizer`` (FQN-keyed, flattened by torchtitan's OptimizersContainer), ``lr_scheduler``,
``dataloader`` (per data-parallel rank, keyed by torchtitan) and ``train_state``; so a ckptio step directory loads
with plain ``dcp.load`` and as torchtitan's ``initial_load_path``. The same policy fields apply (``interval``,
``enable_first_step_checkpoint``, ``last_save_model_only``/``export_dtype``, ``load_only``, ``exclude_from_loading``,
``initial_load_path``/``initial_load_model_only``, step 0 loads the model only); ``keep_latest_k`` becomes ckptio's
``keep_last``; saves are ckptio's (staged, flushed by a writer process, ``max_pending``/``overflow``) instead of
``async_mode``; the copy into staging overlaps the next step's forward and backward, and the optimizer step waits for
it (``maybe_wait_for_staging``, and a guard on the optimizers and the model parts).

This module owns that mapping only. It never writes outside the checkpointer's root, and refuses (``ConfigError``)
what it does not do: Hugging Face safetensors import/export (``initial_load_in_hf``, ``last_save_in_hf``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed.checkpoint as dcp
from torchtitan.components.checkpointer import (
    DATALOADER,
    LR_SCHEDULER,
    MODEL,
    OPTIMIZER,
    BaseCheckpointManager,
    ModelWrapper,
)
from torchtitan.config import TORCH_DTYPE_MAP

from ckptio import Checkpointer
from ckptio.errors import ConfigError

__all__ = ["CkptioCheckpointManager"]

log = logging.getLogger("ckptio.integrations.torchtitan")


class CkptioCheckpointManager(BaseCheckpointManager):
    """torchtitan's checkpoint-manager contract on a ``ckptio.Checkpointer``."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):
        root: str | None = None
        """ckptio root (a path or ``s3://bucket/prefix``); default: ``<dump_folder>/<folder>``."""

        local_dir: str | None = None
        """ckptio's optional local tier (node-local NVMe); restores prefer it when its checksums match."""

        max_pending: int = 1
        """Staged snapshots held at once (the host-memory bound)."""

        overflow: Literal["block", "skip"] = "block"
        """What a save does when no staging slot is free."""

        def __post_init__(self) -> None:
            BaseCheckpointManager.Config.__post_init__(self)
            if self.initial_load_in_hf or self.last_save_in_hf:
                raise ConfigError("CkptioCheckpointManager does not read or write Hugging Face safetensors")

    def __init__(self, config: Config, *, dataloader: Any, model_parts: list[torch.nn.Module], optimizers: Any,
                 lr_schedulers: Any, states: dict[str, Any], sd_adapter: Any, base_folder: str = "") -> None:
        self.enable = config.enable
        if not self.enable:
            return
        self.save_future = None  # ckptio flushes in its writer process
        self.config = config
        self.states = states
        self.states.update({MODEL: ModelWrapper(model_parts), OPTIMIZER: optimizers, DATALOADER: dataloader,
                            LR_SCHEDULER: lr_schedulers})
        for key in config.exclude_from_loading:
            if key not in self.states:
                raise ConfigError(f"exclude_from_loading: {key!r} is not a checkpointed state")
        self.export_dtype = TORCH_DTYPE_MAP[config.export_dtype]
        root = config.root or (config.folder if "://" in config.folder else os.path.join(base_folder, config.folder))
        self.checkpointer = Checkpointer(root, local_dir=config.local_dir, keep_last=config.keep_latest_k,
                                         max_pending=config.max_pending, overflow=config.overflow)
        # save() returns before its copy into the staging slot is done. The Trainer calls maybe_wait_for_staging()
        # before optimizers.step(); the guard covers loops that do not (and buffers changed in forward): the first
        # optimizer step or forward after a save waits for the copy, not the whole save.
        inner = getattr(optimizers, "optimizers", optimizers)  # OptimizersContainer holds one per model part
        self._guard = self.checkpointer.guard(list(inner), model_parts)

    # ---- save ----------------------------------------------------------------------------------------------------
    def _should_save(self, step: int, last_step: bool) -> bool:
        if self.config.load_only:
            return False
        return (step == 1 and self.config.enable_first_step_checkpoint) or last_step or step % self.config.interval == 0

    @torch.no_grad()
    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        if not self._should_save(curr_step, last_step):
            return False
        if last_step and self.config.last_save_model_only:
            # The final checkpoint is an export: model only, in export_dtype (as torchtitan's own manager writes it).
            states = {k: v.to(self.export_dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for k, v in self.states[MODEL].state_dict().items()}
        else:
            states = self._flattened(self.states)
        return not self.checkpointer.save(curr_step, states).skipped

    @staticmethod
    def _flattened(states: dict[str, Any]) -> dict[str, Any]:
        """torchtitan's layout: model FQNs at the top level, the other states under their names."""
        flat = {k: v for k, v in states.items() if k != MODEL and v is not None}
        if MODEL in states:
            flat.update(states[MODEL].state_dict())
        return flat

    def _maybe_wait_for_staging(self) -> None:
        self.checkpointer.wait_staged()

    def _wait_for_saving(self) -> None:
        self.checkpointer.wait()

    # ---- load ----------------------------------------------------------------------------------------------------
    def _states_to_load(self, model_only: bool) -> dict[str, Any]:
        if model_only:
            return dict(self.states[MODEL].state_dict())
        return self._flattened({k: v for k, v in self.states.items() if k not in self.config.exclude_from_loading})

    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        """``step`` -1: the newest committed step; none committed: ``initial_load_path`` if set, else a fresh start."""
        chosen = self.checkpointer.latest_step() if step == -1 else step
        if chosen is None:
            path = self.config.initial_load_path
            if not path:
                log.info("ckptio: no committed checkpoint; a fresh start")
                return False
            # A plain DCP directory (torchtitan's own, a seed checkpoint, or a ckptio step directory).
            states = self._states_to_load(self.config.initial_load_model_only)
            dcp.load(states, checkpoint_id=path)
        else:
            states = self._states_to_load(model_only=chosen == 0)  # step 0 is torchtitan's seed checkpoint
            self.checkpointer.restore(states, step=chosen)
        # Model tensors produced by state-dict hooks are copies: hand the loaded values to the modules.
        self.states[MODEL].load_state_dict(states)
        return True

    def _close(self) -> None:
        guard = self.__dict__.pop("_guard", None)
        if guard is not None:
            guard.remove()
        checkpointer = self.__dict__.pop("checkpointer", None)  # absent: closed already, or __init__ failed early
        if checkpointer is not None:
            checkpointer.close()
