"""The guard that makes the state's first mutation after a save wait until the save is staged.

A save's copy still reads the caller's tensors until it is staged. :class:`StagingGuard` registers an optimizer
step pre-hook and forward pre-hooks on the modules whose forward changes buffers; each calls the stager's
``wait_mutable`` first. Mutations elsewhere need ``Checkpointer.wait_staged()``. This module only registers and
removes hooks: it never copies, decides or writes anything.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ckptio.engine.trainer.stager import Stager


def mutated_in_forward(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules whose forward may change a buffer: those that own buffers (BatchNorm's running statistics and
    batch counter, and any module written like it). Their hook waits only while the module is in training mode,
    the only mode in which such buffers change; parameters change in ``optimizer.step`` (the other hook)."""
    return [m for m in model.modules() if any(True for _ in m.buffers(recurse=False))]


def _as_list(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def _first_step_pre_hook(optimizer: Any, hook: Callable[..., None]) -> Any:
    """Register ``hook`` to run before ``optimizer``'s step pre-hooks registered earlier. torch has no ``prepend=``
    for them; they live in an ordered dict keyed by the handle's id, so the new entry moves to its front."""
    handle = optimizer.register_step_pre_hook(hook)
    hooks = getattr(optimizer, "_optimizer_step_pre_hooks", None)
    if isinstance(hooks, OrderedDict) and handle.id in hooks:
        hooks.move_to_end(handle.id, last=False)
    return handle


class StagingGuard:
    """Hooks that make the first mutation after a save wait until the save is staged; ``remove()`` (or leaving
    the ``with`` block) takes them off. Returned by ``Checkpointer.guard``.

    Its hooks run before every other forward pre-hook of a module and every other step pre-hook of an optimizer,
    whenever those were registered: another pre-hook may itself mutate the saved state (the old
    ``torch.nn.utils.spectral_norm`` runs its power iteration in place on ``weight_u``/``weight_v`` in a forward
    pre-hook), and run first it would put the next step's values in the save. torch's global hooks
    (``register_module_forward_pre_hook``, ``register_optimizer_step_pre_hook``) still run before any module's or
    optimizer's own."""

    def __init__(self, stager: Stager, optimizer: Any = None, model: Any = None) -> None:
        self._stager = stager
        self._hooks: list[Any] = []
        for opt in _as_list(optimizer):
            self._hooks.append(_first_step_pre_hook(opt, lambda *_: stager.wait_mutable()))

        def before_forward(module: torch.nn.Module, _args: Any) -> None:
            if module.training:
                stager.wait_mutable()

        for part in _as_list(model):  # a model, or its parts (pipeline stages, torchtitan's model_parts)
            self._hooks.extend(m.register_forward_pre_hook(before_forward, prepend=True)
                               for m in mutated_in_forward(part))

    def wait(self) -> None:
        """Return once the state saved so far may be mutated: for a framework's own hook before its update (one
        that runs after forward and backward, where a step pre-hook would run before them)."""
        self._stager.wait_mutable()

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def __enter__(self) -> StagingGuard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()
