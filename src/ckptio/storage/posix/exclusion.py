"""Create-only and compare-and-swap on a shared filesystem: exclusion that holds across clients.

A written temp file is published under its name in one of three ways; this module owns the two conditional ones,
built only on :mod:`~ckptio.storage.posix.fs_ops` (operations the filesystem's server decides for every client):

* **create-only**: ``link(tmp, name)``, which fails when the name exists. Where the filesystem refuses hard links,
  the name's lock is taken and the temp file renamed into place only while the name is absent.
* **compare-and-swap**: the name's lock is taken, the name's etag compared (on the file the directory's listing
  names, not a client's cached one), the temp file renamed onto the name, the lock released.

The lock of ``name`` is the file ``.tmp-lock-<name>`` beside it, created with ``O_CREAT | O_EXCL`` and holding its
holder (machine, pid, a token); listings skip it like any temp file. A holder keeps it for one stat and one rename.
A lock is *stale*, and is broken, when its holder's process is gone (same machine: :func:`ckptio._proc.machine_id`)
or when it is older than :data:`STALE_LOCK_S`. Breaking renames the lock to a name of the breaker's own (only one
breaker can), then checks it took the lock it judged; if a fresh lock was taken in between, it is put back.

What makes it safe: a holder renames onto the name only right after checking that the lock is still its own and
younger than half of :data:`STALE_LOCK_S`, so a breaker (which waits for the whole of it) never runs beside a live
holder, unless the holder stalls for that long between two adjacent system calls. It assumes the hosts' clocks
agree within :data:`STALE_LOCK_S` (the owner record assumes 120 s). A conditional write is atomic against the other
conditional writes of the name; an unconditional overwrite racing a compare-and-swap of the same name may be lost
(the commit protocol never overwrites a name it swaps).
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from ckptio._proc import machine_id, pid_alive
from ckptio.errors import StoreCapabilityError
from ckptio.storage.posix.fs_ops import LINK_REFUSED, TMP_PREFIX, FileSystemOps

__all__ = ["LOCK_PREFIX", "STALE_LOCK_S", "Exclusion"]

LOCK_PREFIX = f"{TMP_PREFIX}lock-"
#: Age past which a lock's holder is taken for dead. A holder needs milliseconds; this leaves three orders of
#: magnitude for a slow metadata server, and more than the clock skew between hosts that NTP allows.
STALE_LOCK_S = 30.0
#: How long a writer waits for a lock: long enough to outlive a dead holder's stale lock.
LOCK_WAIT_S = STALE_LOCK_S + 15.0
#: How long a lock holder waits for its client's cached view of the name to agree with the directory (GlusterFS's
#: FUSE client caches for 1 s by default); well under half of STALE_LOCK_S, so the lock is still safely its own.
FRESH_VIEW_S = 5.0
_MACHINE = machine_id()


@dataclass(frozen=True, slots=True)
class _Held:
    """A lock this process took: its file's identity and when it was taken."""

    ino: int
    taken_at: float


class Exclusion:
    """The conditional writes of one directory tree, through ``ops``."""

    def __init__(self, ops: FileSystemOps) -> None:
        self.ops = ops
        self.link_refused = ""
        """Why the filesystem refused a hard link (empty while it takes them): create-only then uses the lock."""

    def create(self, tmp: str, path: str) -> bool:
        """Publish ``tmp`` as ``path`` unless ``path`` exists; False when it does."""
        if not self.link_refused:
            try:
                self.ops.link(tmp, path)
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in LINK_REFUSED:
                    raise
                self.link_refused = exc.strerror or str(exc)
        return self._locked(path, lambda current: current is None, tmp)

    def swap(self, tmp: str, path: str, matches: Callable[[os.stat_result | None], bool]) -> bool:
        """Publish ``tmp`` as ``path`` while ``matches`` the stat of the file now at ``path`` (None: no file);
        False when it does not."""
        return self._locked(path, matches, tmp)

    def _locked(self, path: str, matches: Callable[[os.stat_result | None], bool], tmp: str) -> bool:
        lock = _lock_path(path)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            held = self._acquire(lock, deadline)
            try:
                if not matches(self._current(path, lock, held)):
                    return False
                if self._still_held(lock, held):
                    self.ops.replace(tmp, path)
                    return True
            finally:
                self._release(lock, held)
            # The lock was broken under us (we stalled past half its age): compare again under a new one.

    def _current(self, path: str, lock: str, held: _Held) -> os.stat_result | None:
        """The file at ``path`` as the filesystem's server has it, read under ``path``'s lock.

        A client may answer a stat from its cache: GlusterFS's FUSE client keeps entries and attributes for about
        a second, so a name another client replaced a moment ago still shows the old file, whose etag the caller
        may be holding. A listing of the directory is read from the server. Where the listing gives the inode
        numbers stat gives (checked on the lock this writer has just created), a stat that disagrees with it is
        stale: the lock keeps the name still while this waits, up to :data:`FRESH_VIEW_S`, for the client's view
        to catch up. Where the check cannot be made (a listing without the lock, or other numbers), the stat is
        all there is."""
        directory, name = os.path.split(path)
        deadline = time.monotonic() + FRESH_VIEW_S
        while True:
            st = self._stat(path)
            listed = self.ops.listed_inodes(directory or ".", {name, os.path.basename(lock)})
            if listed.get(os.path.basename(lock)) != held.ino:
                return st
            ino = listed.get(name)
            if (None if st is None else st.st_ino) == ino:
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}: this client's view of the file stayed older than the directory's for "
                                   f"{FRESH_VIEW_S:.0f} s (its attribute cache)")
            time.sleep(0.05)

    def _acquire(self, lock: str, deadline: float) -> _Held:
        body = f"{_MACHINE} {os.getpid()} {secrets.token_hex(4)}\n".encode()
        for attempt in itertools.count():
            try:
                st = self.ops.create_exclusive(lock, body)
                return _Held(ino=st.st_ino, taken_at=time.monotonic())
            except FileExistsError:
                pass
            except OSError as exc:
                if self.link_refused:
                    raise self._neither(lock, exc) from exc
                raise
            self._break_if_stale(lock)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{os.path.basename(lock)} stayed locked for {LOCK_WAIT_S:.0f} s "
                                   f"(holder: {self._holder(lock) or 'unknown'})")
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2**min(attempt, 6))))
        raise AssertionError("unreachable")

    def _still_held(self, lock: str, held: _Held) -> bool:
        if time.monotonic() - held.taken_at >= STALE_LOCK_S / 2:
            return False  # a breaker may be about to judge it stale: never publish under an old lock
        current = self._stat(lock)
        return current is not None and current.st_ino == held.ino

    def _release(self, lock: str, held: _Held) -> None:
        current = self._stat(lock)
        if current is not None and current.st_ino == held.ino:
            self._remove(lock, held.ino)

    def _break_if_stale(self, lock: str) -> None:
        st = self._stat(lock)
        if st is None:
            return
        holder = self._holder(lock).split()
        dead_here = len(holder) == 3 and holder[0] == _MACHINE and _MACHINE != "" \
            and holder[1].isdigit() and not pid_alive(int(holder[1]))
        if dead_here or time.time() - st.st_mtime > STALE_LOCK_S:
            self._remove(lock, st.st_ino)

    def _remove(self, lock: str, ino: int) -> None:
        """Remove the lock file ``ino`` at ``lock``, never another: rename it away (one remover wins), check what
        was taken, and put back a lock that turned out to be a newer one."""
        grave = f"{lock}-gone-{secrets.token_hex(4)}"
        try:
            self.ops.replace(lock, grave)
        except FileNotFoundError:
            return
        try:
            taken = self._stat(grave)
            if taken is not None and taken.st_ino != ino:
                try:
                    self.ops.link(grave, lock)
                except OSError:
                    pass  # taken again meanwhile, or no links: that newer holder finds its lock gone and retries
        finally:
            try:
                self.ops.unlink(grave)
            except FileNotFoundError:
                pass

    def _holder(self, lock: str) -> str:
        try:
            return self.ops.read(lock).decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _stat(self, path: str) -> os.stat_result | None:
        try:
            return self.ops.stat(path)
        except FileNotFoundError:
            return None

    def _neither(self, lock: str, exc: OSError) -> StoreCapabilityError:
        return StoreCapabilityError(
            f"the filesystem of {os.path.dirname(lock)} refuses hard links ({self.link_refused}) and exclusive "
            f"creates ({exc.strerror or exc}): ckptio cannot keep writers on other clients from overwriting each "
            "other's manifest or `latest`. Checkpoint to a filesystem that honours either (`ckptio probe` says "
            "which this one honours)", path=os.path.dirname(lock),
        )


def _lock_path(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f"{LOCK_PREFIX}{name}")
