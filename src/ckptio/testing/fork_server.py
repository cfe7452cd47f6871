"""The one fork server of a test process, which the test kit's fresh processes start from.

Tests start many fresh processes: gloo ranks and rank scripts (:mod:`ckptio.testing.ranks`), the conformance
suite's pool that receives storages only by pickling (:mod:`ckptio.testing.conformance`). A fresh interpreter
imports torch and ckptio again, ~2 CPU-seconds each on the 2-core machines the suite runs on. Each forks instead
from a server that imported them once: a clean process (never the test process, whose threads, sockets and clients
a fork would copy) that does nothing but fork.

A process has one fork server, started by its first user with the preload list in force then, so every user asks
for the same list (:func:`fork_context`): which user comes first changes nothing.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from ckptio.storage.registry import storage_modules

__all__ = ["fork_context"]

_PRELOAD = ("torch", "torch.distributed", "torch.distributed.checkpoint", "ckptio", "ckptio.testing.ranks",
            "ckptio.testing.conformance", "ckptio.testing.spawned")


def fork_context() -> Any:
    """The ``forkserver`` multiprocessing context, its server preloading what the kit's processes import."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*_PRELOAD, *storage_modules()])
    return context
