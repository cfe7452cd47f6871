"""Every process-wide hook ckptio installs, in one module: the one SIGTERM owner, the one exit hook, the fork handlers
and the writer process's signal policy. Nothing else in ckptio calls ``signal.signal``, ``atexit.register`` or
``os.register_at_fork``.

What registers here, and what runs when (the order is this module's, never the order of imports or registrations):

* **At interpreter exit** (one ``atexit`` hook): first every *exit action* (``close_at_exit``: each Checkpointer
  left open is closed as ``close()`` closes it, so its saves in flight commit), then every *release action*
  (``release_on_termination``: staging slot files are unlinked). Closing first matters: a pending save still needs
  its slot file until its writer has mapped it.
* **On a SIGTERM that ends the process**: the release actions, then death by SIGTERM's default action (exit status
  and the parent's view as if ckptio were not there). Exit actions do not run: a process told to terminate does not
  wait for its saves; the writer, which ignores SIGTERM, finishes the save in flight or marks it failed.
* **On a SIGTERM held as a preemption notice** (``hold_sigterm``: two levels with ``preempt_grace_s > 0``): the first
  one only marks the process preempted (the Checkpointer's next save call makes the emergency save and exits). Any
  SIGTERM within ``window_s`` of the first is the same notice delivered twice (Slurm signals every process of the step
  and ``torchrun`` forwards what it got; a container's init forwards to its group) and is absorbed. A SIGTERM after
  the window, or the grace period running out with the emergency save not done, ends the process as above.
* **In a forked child** (``os.register_at_fork``): every registration is forgotten and SIGTERM gets back the
  disposition it had before ckptio: the parent's staging files and writer are not the child's to free or close,
  and terminating a pool's worker must not unlink its parent's slots. SIGTERM is blocked in the forking thread
  around the fork, so a signal that reaches the child before it has forgotten is handled as the child's own.

**SIGTERM is seen by a thread, not by the main thread's Python loop.** A Python-level handler runs only when the main
thread executes bytecode, never while it waits in native code (a gloo collective in ``restore``, a blocked
``save()``, a long C++ call). So the handler's C half writes the signal number to a pipe (``signal.set_wakeup_fd``)
and a watcher thread reads it and acts: it runs the release actions and kills the process from there (the default
action is put back with ``ctypes``, since ``signal.signal`` works on the main thread only). The Python-level handler
itself only hands the signal to the watcher when another library owns the wakeup fd (asyncio, trio).

The handler is installed from the main thread only, while something needs it: a release action with SIGTERM at its
default disposition (a user's own handler is left alone: call ``close()`` from it), or a preemption hold (which takes
SIGTERM over and hands it back, or to the handler that was there, when the process must die). A handler the user
installs after ckptio's takes precedence: the watcher acts only while ckptio's handler is the installed one.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn, TypeVar

from ckptio._wait import bounded

T = TypeVar("T")

_STOP = 0
"""The byte that tells the watcher to stop (no signal has number 0)."""
_WAKE = 255
"""The byte that makes the watcher recompute its deadline (no signal has number 255)."""
_HANDLER_RUN_S = 5.0
"""How long the main thread has to run a user's SIGTERM handler handed back to it before the default action."""


class _Registry:
    """Actions per owner, forgotten when the owner is garbage-collected, in a forked child, or unregistered. No
    lock: single dict operations are atomic, and a weakref callback (which may run inside any allocation, on any
    thread) could never wait for one."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[int, weakref.ref[Any], Callable[[Any], None]]] = {}
        self._tokens = itertools.count()

    def add(self, owner: T, action: Callable[[T], None]) -> Callable[[], None]:
        token = next(self._tokens)
        self._entries[token] = (os.getpid(), weakref.ref(owner, lambda _: self._entries.pop(token, None)), action)

        def unregister() -> None:
            self._entries.pop(token, None)

        return unregister

    def live(self) -> list[tuple[Any, Callable[[Any], None]]]:
        """(owner, action) of this process's live registrations, oldest first."""
        pid, out = os.getpid(), []
        for owner_pid, ref, action in list(self._entries.values()):
            owner = ref()
            if owner_pid == pid and owner is not None:
                out.append((owner, action))
        return out

    def run(self) -> None:
        """Every live action once; one that raises does not stop the others."""
        for owner, action in self.live():
            with contextlib.suppress(Exception):
                action(owner)

    def clear(self) -> None:
        self._entries.clear()


_exit_actions = _Registry()
_release_actions = _Registry()


def close_at_exit(owner: T, action: Callable[[T], None]) -> Callable[[], None]:
    """Run ``action(owner)`` at interpreter exit, before the release actions, unless the returned call unregisters
    it first or ``owner`` is garbage-collected. Only in this process, never in a forked child."""
    return _exit_actions.add(owner, action)


def at_exit_owners() -> list[Any]:
    """The owners whose exit actions this process would run now (what the exit hook would close)."""
    return [owner for owner, _ in _exit_actions.live()]


def release_on_termination(owner: T, action: Callable[[T], None]) -> Callable[[], None]:
    """Run ``action(owner)`` before this process dies of SIGTERM, and at exit after the exit actions. The action
    must not wait for the main thread: it runs on the watcher thread while the main thread may hold anything."""
    unregister = _release_actions.add(owner, action)
    _sigterm.update()

    def release() -> None:
        unregister()
        _sigterm.update()

    return release


class PreemptionHold:
    """SIGTERM held as a preemption notice for one Checkpointer: when it came, and the grace period it allows."""

    def __init__(self, grace_s: float, window_s: float) -> None:
        self.grace_s, self.window_s = grace_s, window_s
        self.finished = False

    @property
    def at(self) -> float | None:
        """``time.monotonic()`` of the first SIGTERM of this notice, or None."""
        return _sigterm.first_at

    def done(self) -> None:
        """The emergency save ran: the grace period no longer ends the process (a later SIGTERM still does)."""
        self.finished = True
        _sigterm.wake()

    def release(self) -> None:
        """Give SIGTERM back (the Checkpointer closed)."""
        _sigterm.drop_hold(self)


def hold_sigterm(grace_s: float, window_s: float) -> PreemptionHold | None:
    """Take SIGTERM over as a preemption notice (main thread only: None elsewhere, and SIGTERM stays as it is)."""
    return _sigterm.add_hold(PreemptionHold(grace_s, window_s))


def writer_ignores_termination() -> None:
    """The writer process's policy: Ctrl-C reaches every process of the terminal's process group, and schedulers
    often SIGTERM the whole group; either would kill the save in flight. The trainer decides when its writer
    stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _set_disposition(handler: signal.Handlers) -> None:
    """SIGTERM's disposition set to ``SIG_DFL`` or ``SIG_IGN`` from any thread: ``signal.signal`` works on the main
    thread only, so this goes through libc (Python's own record of the handler is left stale: the process is about
    to die, or ignores SIGTERM from now on)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signal.SIGTERM, int(handler))


def die_of_sigterm() -> NoReturn:
    """End this process by SIGTERM's default action, from any thread."""
    _set_disposition(signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    time.sleep(_HANDLER_RUN_S)  # not reached where libc honoured the call
    os._exit(128 + signal.SIGTERM)


class _SigtermOwner:
    """The installed handler, the wakeup pipe, the watcher thread, and the preemption notice they keep."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.holds: list[PreemptionHold] = []
        self.first_at: float | None = None
        self._installed = False
        self._previous: Any = signal.SIG_DFL
        self._owns_wakeup = False
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None
        self._hand_back = threading.Event()  # the main thread is to run the previous (user's) handler
        self._handed_back = threading.Event()

    # ---- install / uninstall (main thread) ----------------------------------------------------------------------
    def add_hold(self, hold: PreemptionHold) -> PreemptionHold | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        with self.lock:
            self.holds.append(hold)
            self.update()
        return hold

    def drop_hold(self, hold: PreemptionHold) -> None:
        with self.lock:
            if hold in self.holds:
                self.holds.remove(hold)
            if not self.holds:
                self.first_at = None
            self.update()

    def update(self) -> None:
        """Install or uninstall as the registrations now need (main thread only; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            return
        with self.lock:
            current = signal.getsignal(signal.SIGTERM)
            ours = current is _on_sigterm
            if self.holds or (_release_actions.live() and (ours or current is signal.SIG_DFL)):
                if not ours:
                    self._install(current)
            elif self._installed:
                self._uninstall()

    def _install(self, previous: Any) -> None:
        if self._installed:  # a user's handler replaced ours since: ours goes back on top of it
            self._uninstall()
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        self._previous = previous
        signal.signal(signal.SIGTERM, _on_sigterm)
        other = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._owns_wakeup = other == -1
        if not self._owns_wakeup:  # another library's (asyncio, trio): it stays, our handler forwards SIGTERM
            signal.set_wakeup_fd(other, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(read_fd,), name="ckptio-sigterm", daemon=True)
        self._watcher.start()
        self._installed = True

    def _uninstall(self) -> None:
        assert self._pipe is not None and self._watcher is not None
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:  # a handler installed after ours stays
            signal.signal(signal.SIGTERM, self._previous)
        self._give_back_wakeup()
        # Not joined: the watcher may be waiting for this lock. It stops at this byte (or at the end of the pipe)
        # and closes the read end itself.
        self._send(_STOP)
        os.close(self._pipe[1])
        self._installed, self._pipe, self._watcher = False, None, None

    def forget_after_fork(self) -> None:
        """In a fresh child: nothing is held, SIGTERM is as it was before ckptio, no watcher runs (threads do not
        survive a fork), and the pipe, shared with the parent, is closed."""
        self.holds.clear()
        self.first_at = None
        if not self._installed:
            return
        with contextlib.suppress(ValueError):  # the forking thread is the child's main thread; if not, leave it
            self._give_back_wakeup()
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, self._previous)
        assert self._pipe is not None
        for fd in self._pipe:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._installed, self._pipe, self._watcher = False, None, None

    def _give_back_wakeup(self) -> None:
        """No wakeup fd again where ours is still the one (one set after ours stays)."""
        if self._owns_wakeup and self._pipe is not None:
            current = signal.set_wakeup_fd(-1)
            if current != self._pipe[1]:
                signal.set_wakeup_fd(current, warn_on_full_buffer=False)
        self._owns_wakeup = False

    # ---- the watcher thread -------------------------------------------------------------------------------------
    def wake(self) -> None:
        """Make the watcher recompute its deadline."""
        self._send(_WAKE)

    def _send(self, byte: int) -> None:
        with self.lock, contextlib.suppress(OSError):  # under the lock: uninstall never closes the fd meanwhile
            if self._pipe is not None:
                os.write(self._pipe[1], bytes([byte]))

    def _watch(self, read_fd: int) -> None:
        try:
            while True:
                deadline = self._deadline()
                timeout = None if deadline is None else bounded(deadline - time.monotonic())
                if not select.select([read_fd], [], [], timeout)[0]:
                    self._die()  # the grace period ran out before the emergency save was done
                    continue
                data = os.read(read_fd, 256)
                if not data:  # uninstalled: the write end is closed
                    return
                for byte in data:
                    if byte == _STOP:
                        return
                    if byte == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is _on_sigterm:
                        self._notice(time.monotonic())
        finally:
            os.close(read_fd)

    def _deadline(self) -> float | None:
        with self.lock:
            graces = [h.grace_s for h in self.holds if not h.finished]
            return None if self.first_at is None or not graces else self.first_at + max(graces)

    def _notice(self, now: float) -> None:
        """One SIGTERM: the first of a preemption notice, the same notice again, or the end."""
        with self.lock:
            window = max((h.window_s for h in self.holds), default=None)
            if window is not None and (self.first_at is None or now - self.first_at <= window):
                self.first_at = self.first_at if self.first_at is not None else now
                return  # the first SIGTERM of the notice, or the same notice again
        self._die()

    def _die(self) -> None:
        """Release, then end the process as the handler before ckptio's would have: the default action, or a
        user's handler run by the main thread (the default action after all when the main thread cannot run it)."""
        _release_actions.run()
        previous = self._previous
        if previous is signal.SIG_IGN:  # SIGTERM was ignored before ckptio held it: it is again
            _set_disposition(signal.SIG_IGN)
            with self.lock:
                self.holds.clear()
            return
        if callable(previous):
            self._hand_back.set()
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
            if self._handed_back.wait(_HANDLER_RUN_S):
                with self.lock:
                    self.holds.clear()
                return
        die_of_sigterm()

    def on_main_thread(self, signum: int, frame: FrameType | None) -> None:
        """The Python-level half, on the main thread whenever it runs bytecode again."""
        if self._hand_back.is_set():
            self._hand_back.clear()
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous)
            self._handed_back.set()
            self._previous(signum, frame)
            return
        if self._pipe is not None and not _wakeup_is(self._pipe[1]):
            self._send(signal.SIGTERM)  # another library owns the wakeup fd: the watcher learns it from us


def _wakeup_is(fd: int) -> bool:
    """Whether ``fd`` is the wakeup fd now (main thread only: reading it means setting it back)."""
    current = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(current, warn_on_full_buffer=False)
    return current == fd


_sigterm = _SigtermOwner()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _sigterm.on_main_thread(signum, frame)


# ---- the exit hook and the fork handlers: registered once, when this module loads ---------------------------------
def _at_exit() -> None:
    """Exit actions first (Checkpointers closed: their saves commit), then release actions (slot files)."""
    _exit_actions.run()
    _release_actions.run()


_mask_before_fork: list[set[int | signal.Signals]] = []  # the forking thread's signal mask, while a fork is under way


def _before_fork() -> None:
    _sigterm.lock.acquire()  # held across the fork: the child's copy of the owner is never half-changed
    _mask_before_fork.append(signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))


def _after_fork_in_parent() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork.pop())
    _sigterm.lock.release()


def _after_fork_in_child() -> None:
    _exit_actions.clear()
    _release_actions.clear()
    _sigterm.forget_after_fork()
    _sigterm.lock.release()
    signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork.pop())  # a SIGTERM that came meanwhile is the child's


atexit.register(_at_exit)
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
