"""Small process helpers shared by the engine, the demo and the CLI: is a pid alive, and SIGTERM as Ctrl-C.

Standard library only, so any layer may import it (``storage/`` and ``format/`` have no use for it). Must never
start, wait for or kill a process: callers own their processes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["pid_alive", "sigterm_as_interrupt"]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A SIGTERM inside the block raises KeyboardInterrupt, so it cleans up the way Ctrl-C does.

    Signal handlers can only be set from the main thread; elsewhere the block runs with SIGTERM left alone.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
