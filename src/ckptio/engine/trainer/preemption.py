"""SIGTERM on a two-level job: save to the local level at the next save call, and never outstay the grace period.

Schedulers announce preemption with SIGTERM and follow with SIGKILL after a grace period. With two levels ckptio
turns the announcement into an emergency save to the local level (fast: node-local disks and partner copies):

* The first SIGTERM only marks the process preempted. The next ``save()`` or ``maybe_save()`` on this rank makes an
  emergency save of its state to the local level, waits for its commit (within ``preempt_grace_s`` of the signal),
  and exits with ``SystemExit(0)``. ``maybe_save`` also agrees the preemption across ranks
  (``engine.trainer.maybe_save_votes``), so a SIGTERM that reached some ranks only still saves the same step everywhere.
* When no save call comes within ``preempt_grace_s`` (the loop is restoring, evaluating, preparing data), or a
  second SIGTERM arrives, the process dies as the handler that was there before would have made it die (ckptio's
  staging cleanup, or the default action): SIGTERM is re-raised with that handler back in place. If the main thread
  is stuck in native code and cannot run a Python handler, the watchdog frees the staging slots and exits with
  status 143 (128 + SIGTERM) a few seconds later.

The handler is installed from the main thread only (Python delivers signals there) and only while the
Checkpointer is open; ``uninstall`` puts the previous handler back. It never saves anything itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

_STUCK_MAIN_S = 5.0
"""After the watchdog re-raised SIGTERM, how long the main thread has to run the handler before a hard exit."""


class Preemption:
    """This rank's SIGTERM state: when it came, and the watchdog that enforces the grace period."""

    def __init__(self, grace_s: float, *, on_hard_exit: Callable[[], None] = lambda: None) -> None:
        self.grace_s = grace_s
        self.at: float | None = None
        """``time.monotonic()`` of the first SIGTERM, or None."""
        self._on_hard_exit = on_hard_exit
        self._previous: Any = None
        self._installed = False
        self._expired = False
        self._pid = os.getpid()
        self._watchdog: threading.Thread | None = None
        self._done = threading.Event()

    def install(self) -> bool:
        """Take SIGTERM over (main thread only); False when this thread cannot install handlers."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Give SIGTERM back to the handler that was there before; stop the watchdog."""
        self._done.set()
        if self._installed and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child inherited the handler: it is not this rank
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.at is not None or self._expired:
            self._die()  # a second SIGTERM, or the grace period ran out with no save call
            return
        self.at = time.monotonic()
        self._watchdog = threading.Thread(target=self._watch, name="ckptio-preempt-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        if self._done.wait(self.grace_s):
            return
        self._expired = True
        os.kill(os.getpid(), signal.SIGTERM)  # the main thread's handler dies as the previous handler would
        if self._done.wait(_STUCK_MAIN_S):
            return
        self._on_hard_exit()  # the main thread never ran the handler: free what it would have, and go
        os._exit(128 + signal.SIGTERM)

    def _die(self) -> None:
        self.uninstall()
        os.kill(os.getpid(), signal.SIGTERM)

    def done(self) -> None:
        """The emergency save ran (or the Checkpointer closed): the watchdog stands down."""
        self._done.set()
