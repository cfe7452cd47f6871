"""The staging pipeline: copy a save's tensors into its slot off the training thread, then hand the job on.

``save`` decides, checks the snapshot fits its slot, and *launches* the copy here; it returns at once. The copy
itself runs on one long-lived staging thread per Checkpointer (a queue, ``None`` to stop, joined on close). CUDA
sources are copied by the training thread's launch onto a side CUDA stream, ``non_blocking`` into the page-locked
slot, with an event recorded after them; the staging thread copies the CPU sources, waits on the event, then hands
the job to the writer. Items run in the order they were launched, so the writer sees plans, jobs and step releases
in the trainer's order. ``staging="sync"`` runs the same steps on the training thread (the behaviour before async
staging).

Mutation safety: until a save is staged, its copy still reads the caller's tensors. ``wait_mutable`` is what a
mutation must wait for: every CPU copy launched so far finished, and — on CUDA — the current stream ordered after
every side-stream copy (no host wait). The guard (``engine.trainer.staging_guard``) calls it from an optimizer step
pre-hook and from forward pre-hooks on modules whose buffers change in forward. Without a guard the caller calls
``Checkpointer.wait_staged()`` before mutating the state.

This module never decides whether a step is saved, never runs a collective, never writes to storage itself (the
callbacks it is given do), and never touches ``torch.cuda`` unless a source tensor is on a CUDA device.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ckptio._wait import bounded
from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.protocol import JobLevels, SaveJob
from ckptio.engine.trainer.save_handle import SaveHandle
from ckptio.engine.trainer.save_tracker import SaveTracker
from ckptio.engine.trainer.staging_area import StagingSlot
from ckptio.engine.trainer.writer_proxy import WriterProxy
from ckptio.errors import CkptError, UnsupportedStateError
from ckptio.obs.events import Event, EventLog

log = logging.getLogger("ckptio")


def checked_sizes(slot: StagingSlot, tensors: list[torch.Tensor]) -> int:
    """Raise when ``tensors`` do not match the slot's views (count, shapes); the bytes they stage otherwise."""
    if len(tensors) != len(slot.views):
        raise UnsupportedStateError(f"expected {len(slot.views)} tensors, got {len(tensors)}")
    total = 0
    for dst, src in zip(slot.views, tensors, strict=True):
        if src.shape != dst.shape:
            raise UnsupportedStateError(f"tensor shape changed to {tuple(src.shape)} from {tuple(dst.shape)}")
        total += dst.nbytes
    return total


_Pairs = tuple[list[torch.Tensor], list[torch.Tensor]]


@dataclass(eq=False)
class StagingJob:
    """One save's copy: destination views and sources (CPU pairs and CUDA pairs), and what to do once staged."""

    handle: SaveHandle
    slot: StagingSlot
    cpu: _Pairs
    cuda: _Pairs
    finished: Callable[[], bool]
    """Called on the staging thread once the copy ended; True when the save is still wanted."""
    submit: Callable[[], None]
    failed: Callable[[BaseException], None]
    event: Any = None
    cpu_done: threading.Event = field(default_factory=threading.Event)


def split_by_device(slot: StagingSlot, tensors: list[torch.Tensor]) -> tuple[_Pairs, _Pairs]:
    """(CPU destinations, CPU sources), (CUDA destinations, CUDA sources): only the second goes to a CUDA stream."""
    cpu: _Pairs = ([], [])
    cuda: _Pairs = ([], [])
    for dst, src in zip(slot.views, tensors, strict=True):
        pair = cuda if src.is_cuda else cpu
        pair[0].append(dst)
        pair[1].append(src)
    return cpu, cuda


class Stager:
    """The staging thread of one Checkpointer (``mode="async"``), or the same steps inline (``mode="sync"``)."""

    def __init__(self, mode: Literal["async", "sync"], events: EventLog, tracker: SaveTracker, *,
                 writer: WriterProxy, markers: FailureMarkers, rank: int) -> None:
        self.mode, self.events = mode, events
        self.tracker, self.writer, self.markers, self.rank = tracker, writer, markers, rank
        self._queue: queue.Queue[StagingJob | Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._inflight: list[StagingJob] = []
        self._queued = 0  # items put and not yet run (jobs and ordered callbacks)
        self._streams: dict[Any, Any] = {}
        self._error: BaseException | None = None  # the first staging error wait_staged has not raised yet
        self._pid = os.getpid()

    # ---- the training thread -----------------------------------------------------------------------------------
    def stage(self, handle: SaveHandle, slot: StagingSlot, tensors: list[torch.Tensor], message: SaveJob) -> None:
        """Copy ``tensors`` into ``slot`` for the pending save ``handle``, then submit ``message`` to the writer;
        a copy that fails fails the save (on every rank: a failure marker) instead."""
        cpu, cuda = split_by_device(slot, tensors)

        def submit() -> None:
            self.writer.submit(message)
            self.events.emit(Event.QUEUE, handle.step, pending=self.tracker.staging.pending())

        def failed(error: BaseException) -> None:
            if isinstance(error, CkptError):
                error.rank = self.rank
            # Before the files exist: the save fails on every level it goes to (engine.failure_markers).
            self.markers.mark(message.levels, handle.step, f"rank{self.rank}", handle.save_id, error)
            self.tracker.complete(handle.save_id, error)

        self.events.emit(Event.STAGE_BEGIN, handle.step)
        self.launch(StagingJob(handle, slot, cpu, cuda, finished=lambda: self.tracker.staging_finished(handle),
                               submit=submit, failed=failed))
        if self.mode == "sync" and handle._staging_error is not None:
            handle._reported = True  # raised by save() itself, as before async staging
            raise handle._staging_error

    def launch(self, job: StagingJob) -> None:
        """Start ``job``'s copy; in async mode this returns before the copy is done."""
        if job.cuda[1]:
            self._launch_cuda(job)
        if self.mode == "sync":
            self._run(job)
            return
        with self._cond:
            self._inflight.append(job)
        self._put(job)

    def after(self, action: Callable[[], None]) -> None:
        """Run ``action`` after every job launched so far was handed on (at once when nothing is queued)."""
        if self.mode == "sync" or self._idle():
            action()
        else:
            self._put(action)

    def drop(self, step: int, save_id: int, reason: str, levels: JobLevels) -> None:
        """Tell the other ranks, through the store and off the training thread, that attempt ``save_id`` of
        ``step`` will not commit: a drop marker on each of ``levels``, so their saves of it complete as dropped
        (``engine.writer.step_committer``)."""
        def write() -> None:
            self.markers.mark(levels, step, f"rank{self.rank}", save_id, reason, dropped=True)

        if self.mode == "sync":
            write()
        else:
            self._put(write)

    def wait_mutable(self) -> None:
        """Return once the caller may mutate the state saved so far (see the module docstring). Never raises. In a
        forked child it returns at once: the child's state is its own copy, and no staging thread runs there to
        finish a copy the parent had in flight."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            jobs = list(self._inflight)
        for job in jobs:
            job.cpu_done.wait()
            if job.event is not None:
                # The GPU orders the mutation after the copy; the host does not wait.
                torch.cuda.current_stream(job.cuda[1][0].device).wait_event(job.event)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every launched copy is staged and handed on; False when ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queued == 0 and not self._inflight, bounded(timeout))

    def take_error(self) -> BaseException | None:
        with self._cond:
            error, self._error = self._error, None
        return error

    def close(self) -> None:
        """Finish the queued copies (they are handed on), then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    # ---- internals ---------------------------------------------------------------------------------------------
    def _idle(self) -> bool:
        with self._cond:
            return self._queued == 0

    def _put(self, item: StagingJob | Callable[[], None]) -> None:
        with self._cond:
            self._queued += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ckptio-staging", daemon=True)
                self._thread.start()
        self._queue.put(item)

    def _launch_cuda(self, job: StagingJob) -> None:
        """Enqueue the device-to-host copies on a side stream after the work already queued on the current one;
        an event marks their end. The caller's allocator must not reuse the sources meanwhile: record_stream."""
        dsts, srcs = job.cuda
        device = srcs[0].device
        job.slot.pin()
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), torch.no_grad():
            # Mixed devices in one list: foreach falls back per tensor, each on its own device's side stream.
            torch._foreach_copy_(dsts, srcs, non_blocking=job.slot.pinned)
        for src in srcs:
            src.record_stream(stream)
        job.event = torch.cuda.Event()
        job.event.record(stream)

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if isinstance(item, StagingJob):
                    self._run(item)
                else:
                    item()
            except BaseException:  # a failed action must not stop the thread: later saves still need it
                log.exception("ckptio: a staging-thread action failed")
            finally:
                with self._cond:
                    self._queued -= 1
                    if isinstance(item, StagingJob) and item in self._inflight:
                        self._inflight.remove(item)
                    self._cond.notify_all()

    def _run(self, job: StagingJob) -> None:
        step, t0 = job.handle.step, time.monotonic()
        error: BaseException | None = None
        try:
            dsts, srcs = job.cpu
            if srcs:
                with torch.no_grad():
                    # One foreach call instead of thousands of copy_ calls: per-call overhead dominates small
                    # tensors. It runs without the GIL, so the training thread keeps computing meanwhile.
                    torch._foreach_copy_(dsts, srcs)
            job.cpu_done.set()
            if job.event is not None:
                job.event.synchronize()
        except BaseException as exc:
            error = exc if isinstance(exc, CkptError) else UnsupportedStateError(
                f"copying the state into the staging slot failed: {type(exc).__name__}: {exc}", step=step)
        finally:
            job.cpu_done.set()
        if error is None:
            self.events.emit(Event.STAGE_END, step, bytes=job.handle.bytes, seconds=time.monotonic() - t0)
        else:
            with self._cond:
                self._error = self._error or error
        try:
            if job.finished():
                if error is None:
                    job.submit()
                else:  # the caller learns the copy failed at once (before the save completes with it); markers next
                    job.handle._mark_staged(error)
                    job.failed(error)
        finally:
            # A save ``wait_staged`` calls staged is the writer's (its message is in the writer's pipe), so a trainer
            # killed right after still ends in a commit or a failure marker, never in nothing.
            job.handle._mark_staged(error)
