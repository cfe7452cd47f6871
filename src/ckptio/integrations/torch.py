"""``AppState``: the whole training state of a plain PyTorch loop as one DCP ``Stateful``.

    app = AppState(model, optimizer, scheduler, extras={"loader": stateful_loader, "progress": progress})
    start = ck.restore({"app": app}) or 0
    batches = iter(stateful_loader)   # draws from torch's RNG ...
    app.reapply_rng()                 # ... so set the restored states again right before the first step
    ...
    ck.maybe_save(step, {"app": app})

What it saves, under the key the caller chose (``app`` above)::

    model.*            get_state_dict(model, optimizers): FQN-keyed tensors / DTensors (FSDP2, TP), deduplicated
    optim.*            the optimizers' state, FQN-keyed, reshardable
    schedulers.<i>.*   each LR scheduler's state_dict()
    extras.<name>      a plain value (pickled blob), the same on every rank (DCP keeps one copy)
    ranks.<r>.rng      this rank's RNG states: torch CPU, CUDA (current device), numpy, python (pickled blob)
    ranks.<r>.extras.<name>  this rank's state of each extra with state_dict/load_state_dict (a dataloader's position)
    meta.*             layout version, which optimizers had no state yet

Per-rank values live under per-rank keys because DCP de-duplicates equal keys across ranks: one ``rng`` key would keep a
single rank's generator and hand it to every rank on restore.

This module owns the mapping of those objects onto one state dict and back, and the RNG capture. It never performs I/O
or collectives of its own (``get_state_dict``/``set_state_dict`` run the ones FSDP needs), and never changes the
training it saves: an optimizer that had no state before a save has none after it.
"""

from __future__ import annotations

import dataclasses
import io
import random
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from ckptio.errors import ConfigError

__all__ = ["AppState", "StateDictOptions", "capture_rng", "restore_rng"]

FORMAT = 1


# ---- RNG ---------------------------------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """This process's RNG states: python ``random``, numpy's global generator, torch CPU, and CUDA's current device
    when CUDA is already in use (reading it would otherwise initialize CUDA as a side effect)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set the generators ``capture_rng`` captured (a missing one is left alone: CUDA on a CPU-only restore)."""
    if "python" in state:
        random.setstate(state["python"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ---- blobs -------------------------------------------------------------------------------------------------------
def _blob(value: Any) -> bytes:
    """One opaque DCP object. A nested dict would be flattened into keys, and a restore template whose keys differ from
    the checkpoint's (a dataloader's state before and after iterating) would not load; bytes are a single leaf."""
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _unblob(data: bytes) -> Any:
    # The bytes come from this application's own checkpoint; DCP unpickles its objects the same way.
    return torch.load(io.BytesIO(data), weights_only=False)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _as_list(value: Any, what: str, kind: type | None = None) -> list[Any]:
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if kind is not None and not isinstance(item, kind):
            raise ConfigError(f"AppState {what} must be {kind.__name__} (or a list of them), got {type(item).__name__}")
        if kind is None and not (hasattr(item, "state_dict") and hasattr(item, "load_state_dict")):
            raise ConfigError(f"AppState {what} needs state_dict/load_state_dict, got {type(item).__name__}")
    return items


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


class AppState(Stateful):
    """Model(s), optimizer(s), LR scheduler(s), RNG states and extras, saved and restored as one ``Stateful``.

    ``model``/``optimizer``/``scheduler`` are each one object or a list. With several models (pipeline stages,
    model chunks), ``optimizer`` is empty or one optimizer per model, and optimizer states are flattened to FQN keys
    so that stages can be re-split on restore. ``extras`` maps names to objects with ``state_dict``/
    ``load_state_dict`` (saved per rank: a ``StatefulDataLoader``'s position) or to plain picklable values (saved
    once, must be equal on every rank; after a restore the new value is in ``app.extras[name]``, and a dict is
    updated in place). ``rng`` saves and restores each rank's RNG states. ``options`` goes to
    ``get_state_dict``/``set_state_dict`` (full vs sharded state dicts, CPU offload, strictness...).
    """

    def __init__(
        self,
        model: nn.Module | Iterable[nn.Module],
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
        scheduler: Any = None,
        *,
        extras: Mapping[str, Any] | None = None,
        rng: bool = True,
        options: StateDictOptions | None = None,
    ) -> None:
        self.models: list[nn.Module] = _as_list(model, "model", nn.Module)
        if not self.models:
            raise ConfigError("AppState needs a model")
        self.optimizers: list[torch.optim.Optimizer] = _as_list(optimizer, "optimizer", torch.optim.Optimizer)
        self.schedulers: list[Any] = _as_list(scheduler, "scheduler")
        if len(self.models) > 1 and self.optimizers and len(self.optimizers) != len(self.models):
            raise ConfigError(f"AppState with {len(self.models)} models needs one optimizer per model, "
                              f"got {len(self.optimizers)}")
        if extras is not None and not isinstance(extras, Mapping):
            raise ConfigError(f"AppState extras must be a mapping of names to objects, got {type(extras).__name__}")
        self.extras: dict[str, Any] = dict(extras or {})
        self.rng = rng
        self.options = options if options is not None else StateDictOptions()
        #: the RNG states the last ``load_state_dict`` set (``reapply_rng`` sets them again); None before a restore
        self.restored_rng: dict[str, Any] | None = None
        self._part_keys: list[tuple[set[str], set[str]]] = []

    # ---- save side -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        fresh = [not opt.state for opt in self.optimizers]
        model_sd, optim_sd = self._get_model_and_optim(fresh)
        sd: dict[str, Any] = {"model": model_sd, "meta": {"format": FORMAT, "fresh_optimizers": fresh}}
        if self.optimizers:
            sd["optim"] = optim_sd
        if self.schedulers:
            sd["schedulers"] = [s.state_dict() for s in self.schedulers]
        plain = {name: _blob(v) for name, v in self.extras.items() if not _is_stateful(v)}
        if plain:
            sd["extras"] = plain
        own: dict[str, Any] = {}
        if self.rng:
            own["rng"] = _blob(capture_rng())
        stateful = {name: _blob(v.state_dict()) for name, v in self.extras.items() if _is_stateful(v)}
        if stateful:
            own["extras"] = stateful
        if own:
            sd["ranks"] = {str(_rank()): own}
        return sd

    def _get_model_and_optim(self, fresh: list[bool]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``get_state_dict`` per model. It creates missing optimizer state with one zero-lr ``step()`` so that a
        restore has tensors to load into; this undoes that step on optimizers that had no state, so a save (say at
        step 0) never changes training, and makes sure it runs even when gradients are present."""
        stashed = self._stash_grads(fresh)
        try:
            model_sd: dict[str, Any] = {}
            optim_sd: dict[str, Any] = {}
            self._part_keys = []
            options = self._options()
            for i, model in enumerate(self.models):
                optims = self._optimizers_of(i)
                if optims:
                    msd, osd = get_state_dict(model, optims, options=options)
                else:
                    msd, osd = get_model_state_dict(model, options=options), {}
                if not model_sd.keys().isdisjoint(msd):
                    raise ConfigError("AppState models share parameter names; give each part its own names "
                                      "(pipeline stages keep the full model's FQNs)")
                self._part_keys.append((set(msd), set(osd)))
                model_sd.update(msd)
                optim_sd.update(osd)
        finally:
            for param, grad in stashed:
                param.grad = grad
        for opt, was_fresh in zip(self.optimizers, fresh, strict=True):
            if was_fresh:
                # The returned state dict keeps the tensors for staging or loading; the optimizer goes back to empty.
                opt.state.clear()
        return model_sd, optim_sd

    def _stash_grads(self, fresh: list[bool]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """DCP skips creating optimizer state when any parameter has a gradient (it takes that for a stateless
        optimizer); its restore template then has no optimizer tensors and the optimizer state is silently not
        restored. Gradients of state-less optimizers are set aside for the call and put back after it."""
        stashed = []
        for opt, was_fresh in zip(self.optimizers, fresh, strict=True):
            if not was_fresh:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        stashed.append((param, param.grad))
                        param.grad = None
        return stashed

    def _options(self) -> StateDictOptions:
        if len(self.models) > 1 and self.optimizers and not self.options.flatten_optimizer_state_dict:
            # Optimizer states of several models merge into one dict only with FQN keys (no param-group indices).
            return dataclasses.replace(self.options, flatten_optimizer_state_dict=True)
        return self.options

    def _optimizers_of(self, index: int) -> list[torch.optim.Optimizer]:
        if not self.optimizers:
            return []
        return self.optimizers if len(self.models) == 1 else [self.optimizers[index]]

    # ---- restore side --------------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._set_model_and_optim(state_dict.get("model", {}), state_dict.get("optim", {}))
        meta = state_dict.get("meta", {})
        for opt, was_fresh in zip(self.optimizers, meta.get("fresh_optimizers", []), strict=False):
            if was_fresh:
                opt.state.clear()  # saved before its first step: restore it without state, as it was
        for sched, sched_sd in zip(self.schedulers, state_dict.get("schedulers", []), strict=False):
            sched.load_state_dict(sched_sd)
        for name, data in state_dict.get("extras", {}).items():
            self._set_plain_extra(name, _unblob(data))
        own = state_dict.get("ranks", {}).get(str(_rank()), {})
        for name, data in own.get("extras", {}).items():
            if name in self.extras:
                self.extras[name].load_state_dict(_unblob(data))
        if self.rng and "rng" in own:
            self.restored_rng = _unblob(own["rng"])
            restore_rng(self.restored_rng)

    def _set_model_and_optim(self, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
        options = self._options()
        if not self._part_keys:
            self._get_model_and_optim([not opt.state for opt in self.optimizers])
        for i, model in enumerate(self.models):
            mkeys, okeys = self._part_keys[i]
            msd = {k: v for k, v in model_sd.items() if k in mkeys}
            optims = self._optimizers_of(i)
            if optims:
                osd = {k: v for k, v in optim_sd.items() if k in okeys} if len(self.models) > 1 else optim_sd
                set_state_dict(model, optims, model_state_dict=msd, optim_state_dict=osd, options=options)
            else:
                set_model_state_dict(model, msd, options=options)

    def _set_plain_extra(self, name: str, value: Any) -> None:
        current = self.extras.get(name)
        if isinstance(current, dict) and isinstance(value, dict):
            current.clear()
            current.update(value)  # callers holding the dict see the restored values
        else:
            self.extras[name] = value

    def reapply_rng(self) -> bool:
        """Set the RNGs again to the states the last restore loaded, for loops that must re-seed at a later point
        than the restore (the Hugging Face Trainer does it after skipping the batches already trained on).
        False when nothing was restored."""
        if self.restored_rng is None:
            return False
        restore_rng(self.restored_rng)
        return True

