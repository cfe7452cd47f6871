"""Saves still in flight when the interpreter exits without ``close()``: finish them within a bound, and say so.

Why: a script that ends right after ``save(N)`` (no ``wait``, no ``close``, no ``with``) would otherwise lose step
N silently in most runs, and sometimes die of SIGABRT. The staging thread and the writer-reader thread are daemon
threads: the interpreter goes on finalizing while the copy runs, the staging module's exit hook unlinks the slot
before the writer maps it, and a daemon thread that is freeing tensors when finalization takes the GIL is ended by
``pthread_exit`` inside torch's ``noexcept`` C++ deallocator (``terminate called without an active exception``).

The rule: at exit, every Checkpointer this process built and did not close is closed as ``close()`` closes it, so
its pending saves get up to ``close_timeout_s`` (the bound ``close()`` documents) to commit, then the staging thread
is joined and the writer stopped before finalization starts. When saves were in flight, or a failure was never
reported, one line on stderr names the steps, how long the exit waited and each outcome (committed, dropped,
failed). A failure that ``close()`` raises is printed on that line: an exception in an exit hook would only be a
traceback, and the exit status stays the script's own.

The exit hook is :mod:`ckptio.engine.process_hooks`'s, which runs these closes before it unlinks any staging slot.
It holds weak references, so a Checkpointer that is garbage-collected is neither kept alive nor waited for;
``close()`` unregisters (the callable ``register`` returns is one of its resources). Only the process that built a
Checkpointer closes it at exit: a forked child shares the parent's writer socket and root claim, and its exit must
not stop the parent's writer. This module decides nothing about a save (``close()`` does) and never raises from the
exit hook.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ckptio.engine import process_hooks

if TYPE_CHECKING:
    from ckptio.config import CheckpointerConfig
    from ckptio.engine.trainer.save_handle import SaveHandle
    from ckptio.storage import Storage


class Checkpointer(Protocol):
    """What the exit hook needs of a ``Checkpointer``, all of it public: its saves in flight, where they go, the
    bound ``close()`` documents, and ``close()`` (named by shape: the Checkpointer imports this module)."""

    config: CheckpointerConfig
    storage: Storage

    def pending_saves(self) -> list[SaveHandle]: ...

    def close(self) -> None: ...

def register(checkpointer: Checkpointer) -> Callable[[], None]:
    """Close ``checkpointer`` at interpreter exit unless it was closed before; returns the call that unregisters."""
    return process_hooks.close_at_exit(checkpointer, close_at_exit)


def close_at_exit(checkpointer: Checkpointer) -> None:
    """Close ``checkpointer`` as ``close()`` does (pending saves get up to ``close_timeout_s``), then print one
    line on stderr when saves were in flight or a failure was never reported. Never raises."""
    handles = checkpointer.pending_saves()
    t0 = time.monotonic()
    error: BaseException | None = None
    try:
        checkpointer.close()
    except BaseException as exc:  # an exit hook's exception is only a traceback: the line below reports it
        error = exc
    if not handles and error is None:
        return
    waited = time.monotonic() - t0
    outcomes = "; ".join(f"step {h.step} {_outcome(h)}" for h in handles)
    if error is not None and all(error is not h.error for h in handles):
        outcomes += ("; " if outcomes else "") + f"an earlier save failed ({type(error).__name__}: {error})"
    steps = ", ".join(str(h.step) for h in handles) or "none"
    print(f"ckptio: exiting without close(): waited {waited:.1f} s (bound: close_timeout_s="
          f"{checkpointer.config.close_timeout_s:g} s) for the saves in flight to {checkpointer.storage.url} "
          f"(steps: {steps}): {outcomes}", file=sys.stderr, flush=True)


def _outcome(handle: SaveHandle) -> str:
    if handle.dropped:
        return f"dropped ({handle.skip_reason})"
    if handle.error is not None:
        return f"failed ({type(handle.error).__name__}: {handle.error})"
    return "committed" if handle.done() else "not finished"
