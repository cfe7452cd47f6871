"""A process for tests/engine/test_process_hooks.py: registers with ``ckptio.engine.process_hooks`` (no torch, no
Checkpointer), prints what its actions do, and then exits, forks or waits to be signalled.

Usage: python hooks_job.py MODE [GRACE_S WINDOW_S]. Every line it prints is flushed at once. Modes:

* ``order``: a release action, an exit action, another release action, registered in that order; then exit.
* ``fork``: the same registrations; a forked child reports what it would run and ends as a script does (its exit
  hook runs); then the parent exits.
* ``native``: a release action, then the main thread blocks in native code (a mutex locked twice: it never
  returns to the interpreter, whatever signal comes).
* ``user``: a release action, then a handler of the user's own installed after it; then waits in Python.
* ``hold``: a preemption hold (GRACE_S, WINDOW_S) and a release action; then blocks in native code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from ckptio.engine import process_hooks


class Owner:
    def __init__(self, name: str) -> None:
        self.name = name


def say(line: str) -> None:
    print(line, flush=True)


def block_in_native_code() -> None:
    """Lock a plain pthread mutex twice: the second lock waits forever in libc, and a mutex wait is never
    interrupted by a signal (no EINTR), so the interpreter never gets the main thread back."""
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # all zero: PTHREAD_MUTEX_INITIALIZER (sizeof is 40 on x86-64)
    libc.pthread_mutex_lock(mutex)
    say("blocked")
    libc.pthread_mutex_lock(mutex)
    say("unblocked")  # never


OWNERS = [Owner("release-1"), Owner("exit"), Owner("release-2")]  # alive until exit: the registry holds weak refs


def main() -> None:
    mode, owners = sys.argv[1], OWNERS
    if mode in ("order", "fork"):
        process_hooks.release_on_termination(owners[0], lambda o: say(o.name))
        process_hooks.close_at_exit(owners[1], lambda o: say(o.name))
        process_hooks.release_on_termination(owners[2], lambda o: say(o.name))
    if mode == "fork":
        child = os.fork()
        if child == 0:
            say(f"child would close {len(process_hooks.at_exit_owners())}")
            say(f"child sigterm default {signal.getsignal(signal.SIGTERM) is signal.SIG_DFL}")
            sys.exit(0)  # runs the exit hook the child inherited: it must find nothing of the parent's
        os.waitpid(child, 0)
        say("parent exits")
    elif mode == "native":
        process_hooks.release_on_termination(owners[0], lambda o: say(o.name))
        block_in_native_code()
    elif mode == "user":
        process_hooks.release_on_termination(owners[0], lambda o: say(o.name))
        signal.signal(signal.SIGTERM, lambda *_: say("user handler"))
        say("waiting")
        time.sleep(3600)
    elif mode == "hold":
        hold = process_hooks.hold_sigterm(float(sys.argv[2]), float(sys.argv[3]))
        assert hold is not None
        process_hooks.release_on_termination(owners[0], lambda o: say(o.name))
        block_in_native_code()


if __name__ == "__main__":
    main()
