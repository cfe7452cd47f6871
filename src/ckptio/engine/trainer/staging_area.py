"""Reusable host buffers that hold one snapshot of a rank's tensors (a staging slot).

A slot is one file in the staging directory (``staging_dir``, default ``/dev/shm``) mapped by the trainer and by
its writer process, so the writer reads the snapshot
without a copy and without the training process's GIL. Buffers are allocated on first use, pre-faulted
(``MAP_POPULATE``: a copy into fresh pages runs at a third of the speed of a copy into touched ones) and reused for
every later save while the layout's size holds. On CUDA the slot is page-locked (``cudaHostRegister``) so
device-to-host copies run ``non_blocking`` and one stream sync ends the staging.

Slot files never outlive their process by design: ``close`` unlinks them, and every live staging area is a release
action of :mod:`ckptio.engine.process_hooks`, so an interpreter that exits without ``close`` unlinks them at exit
(after the open Checkpointers were closed), and a SIGTERM that ends the process unlinks them before it dies. A
user's own SIGTERM handler is left alone (call ``Checkpointer.close`` from it). Unlinking never disturbs a save in
flight: the writer keeps its mapping. Only kill -9 leaves files behind, which the next Checkpointer on the host
removes (``remove_stale_slots``).

Slot files belong to the process that created them, never to its forked children. A child forked while a
Checkpointer lives (a ``multiprocessing`` pool, a data loader's workers) inherits the slots' objects; were they to
act there, terminating the pool's workers would unlink the parent's slots, and the next writer the parent started
would fail every save on the missing file. So each slot unlinks only in the process that created it, and a forked
child forgets every release action (``process_hooks``).

This module never serializes, hashes or writes to storage: the training process only copies.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import tempfile
import threading

import torch

from ckptio._proc import pid_alive
from ckptio._wait import bounded
from ckptio.engine import process_hooks
from ckptio.engine.side_group import SideGroup
from ckptio.errors import CkptError, ConfigError, StorageFullError, UnsupportedStateError
from ckptio.format.layout import RankLayout

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
SLOT_PREFIX = "ckptio-slot-"
# What a StorageFullError from staging tells the user to do (the sizing rule is in docs/engine.md).
STAGING_FIXES = ("give it more room (a container's /dev/shm: docker run --shm-size=<bytes>, Kubernetes: an emptyDir "
                 "with medium: Memory), point staging_dir= at a larger tmpfs or local directory, or lower max_pending")


def staging_dir(configured: str | os.PathLike[str] | None) -> str:
    """The directory slots live in: ``configured``, else /dev/shm (the temp dir where there is none)."""
    if configured is None:
        return SHM_DIR
    path = os.fspath(configured)
    if not os.path.isdir(path):
        raise ConfigError(f"staging_dir {path!r} is not a directory")
    return path


def remove_stale_slots(directory: str = SHM_DIR) -> int:
    """Delete slot files left by processes that died (kill -9 skips every cleanup). Returns how many."""
    removed = 0
    for name in os.listdir(directory):
        if not name.startswith(SLOT_PREFIX):
            continue
        try:
            pid = int(name[len(SLOT_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
                removed += 1
    return removed


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedStateError(f"unknown dtype {name!r}")
    return dtype


class StagingSlot:
    """One shared-memory buffer holding a snapshot; ``views`` are typed tensors over it, one per tensor entry."""

    def __init__(self, slot_id: int, nbytes: int, directory: str = SHM_DIR) -> None:
        self.slot_id = slot_id
        self.nbytes = max(nbytes, 1)
        self.owner_pid = os.getpid()
        self.path = os.path.join(directory, f"{SLOT_PREFIX}{os.getpid()}-{slot_id}-{secrets.token_hex(3)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, self.nbytes)
            except OSError as exc:
                os.unlink(self.path)
                raise StorageFullError(
                    f"cannot allocate a {self.nbytes}-byte staging slot in {directory}: {exc.strerror}; "
                    f"{STAGING_FIXES}",
                    path=self.path,
                ) from exc
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mmap = mmap.mmap(fd, self.nbytes, flags=flags)
        finally:
            os.close(fd)
        self.base = torch.frombuffer(self._mmap, dtype=torch.uint8)
        self.layout: RankLayout | None = None
        self.views: list[torch.Tensor] = []
        self.pinned = False
        self.busy = False

    def bind(self, layout: RankLayout) -> None:
        """Make typed views for ``layout`` (cheap; the memory is reused)."""
        if layout is self.layout:
            return
        views = []
        for entry in layout.tensors:
            raw = self.base[entry.slot_offset : entry.slot_offset + entry.nbytes]
            views.append(raw.view(_dtype(entry.dtype)).view(entry.shape))
        self.views, self.layout = views, layout

    def pin(self) -> None:
        """Page-lock the slot for asynchronous device-to-host copies (once, on first CUDA save)."""
        if self.pinned or not torch.cuda.is_available():
            return
        err = torch.cuda.cudart().cudaHostRegister(self.base.data_ptr(), self.nbytes, 0)
        self.pinned = int(err) == 0

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.base.data_ptr())
            self.pinned = False
        self.views, self.layout = [], None
        del self.base
        # The mmap stays open until no tensor views it; the file goes now so nothing leaks in /dev/shm.
        with contextlib.suppress(BufferError):
            self._mmap.close()
        self.unlink()

    def unlink(self) -> None:
        """Remove the slot's file, in the process that created it only: a forked child that closes or dies holding
        a copy of this object must not take the parent's staging memory (and its writer's next mapping) with it."""
        if os.getpid() == self.owner_pid:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def copy_into_slot(slot: StagingSlot, tensors: list[torch.Tensor]) -> int:
    """Copy ``tensors`` (in layout order) into the slot's views; returns bytes copied.

    CUDA sources are copied ``non_blocking`` into the page-locked slot and synchronised once at the end, so the
    device-to-host transfers overlap each other instead of paying one sync per tensor.
    """
    if len(tensors) != len(slot.views):
        raise UnsupportedStateError(f"expected {len(slot.views)} tensors, got {len(tensors)}")
    any_cuda = any(t.is_cuda for t in tensors)
    if any_cuda:
        slot.pin()
    total = 0
    for dst, src in zip(slot.views, tensors, strict=True):
        if src.shape != dst.shape:
            raise UnsupportedStateError(f"tensor shape changed to {tuple(src.shape)} from {tuple(dst.shape)}")
        total += dst.nbytes
    if tensors:  # a rank whose replicated tensors were all assigned to other ranks stages nothing
        with torch.no_grad():
            # One foreach call instead of thousands of copy_ calls: per-call overhead dominates small tensors.
            torch._foreach_copy_(slot.views, tensors, non_blocking=any_cuda and slot.pinned)
    if any_cuda:
        torch.cuda.synchronize()
    return total


class StagingArea:
    """The ``max_pending`` slots of one rank in ``directory``, resized when the layout grows."""

    def __init__(self, max_pending: int, directory: str = SHM_DIR) -> None:
        self.max_pending = max_pending
        self.directory = directory
        self.slots: list[StagingSlot | None] = [None] * max_pending
        self._cond = threading.Condition()
        self._unregister = process_hooks.release_on_termination(self, StagingArea.unlink_files)

    def unlink_files(self) -> None:
        """Remove the slot files now (SIGTERM, exit); the mappings stay usable until ``close``. Takes no lock: it
        runs on the SIGTERM watcher thread while the training thread may hold one."""
        for slot in list(self.slots):
            if slot is not None:
                slot.unlink()

    def bytes_to_allocate(self, layout: RankLayout) -> int:
        """Bytes the staging directory must still provide for all ``max_pending`` slots of ``layout``: a slot that
        already fits is reused, and one that is too small gives its bytes back before it is replaced."""
        need = max(layout.slot_bytes, 1)
        with self._cond:
            return sum(need - (s.nbytes if s is not None else 0) for s in self.slots if s is None or s.nbytes < need)

    def check_fits(self, layout: RankLayout) -> None:
        """Raise :class:`StorageFullError` when ``max_pending`` slots of ``layout`` cannot fit in the staging
        directory's free space; called before the first byte of a layout is staged."""
        missing = self.bytes_to_allocate(layout)
        if missing <= 0:
            return
        st = os.statvfs(self.directory)
        free = st.f_bavail * st.f_frsize
        if missing > free:
            raise StorageFullError(
                f"staging needs {missing:,} more bytes in {self.directory} ({self.max_pending} slot(s) of "
                f"{layout.slot_bytes:,} bytes) but only {free:,} are free: {STAGING_FIXES}",
                path=self.directory,
            )

    def free_slot_id(self) -> int | None:
        with self._cond:
            return self._free_slot_id()

    def pending(self) -> int:
        with self._cond:
            return sum(1 for s in self.slots if s is not None and s.busy)

    def wait_free(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._free_slot_id() is not None, bounded(timeout))

    def _free_slot_id(self) -> int | None:
        for i, slot in enumerate(self.slots):
            if slot is None or not slot.busy:
                return i
        return None

    def acquire(self, slot_id: int, layout: RankLayout) -> StagingSlot:
        """Mark slot ``slot_id`` busy, (re)allocating it when the layout needs more bytes."""
        with self._cond:
            slot = self.slots[slot_id]
            if slot is not None and slot.busy:
                raise RuntimeError(f"staging slot {slot_id} is busy")
            if slot is None or slot.nbytes < layout.slot_bytes:
                if slot is not None:
                    slot.close()
                slot = StagingSlot(slot_id, layout.slot_bytes, self.directory)
                self.slots[slot_id] = slot
            slot.busy = True
        slot.bind(layout)
        return slot

    def release(self, slot_id: int) -> None:
        with self._cond:
            slot = self.slots[slot_id]
            if slot is not None:
                slot.busy = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            for slot in self.slots:
                if slot is not None:
                    slot.close()
            self.slots = [None] * self.max_pending
            self._cond.notify_all()
        self._unregister()


def check_fits_on_every_rank(area: StagingArea, layout: RankLayout, group: SideGroup) -> None:
    """Every rank raises when any rank's ``max_pending`` slots do not fit its staging directory (one tiny
    all-reduce, on re-plans only), so no rank stages, or sends its writer a job, for a step the others give up."""
    problem: CkptError | None = None
    try:
        area.check_fits(layout)
    except CkptError as exc:
        problem = exc
    if group.any_true(problem is not None) and problem is None:
        problem = StorageFullError("another rank's staging slots do not fit its staging directory")
    if problem is not None:
        problem.rank = group.rank
        raise problem
