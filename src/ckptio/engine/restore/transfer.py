"""A rank's part of a restore's read plan, run: read its tasks from the store, verify each checksum block, send
them to the ranks that need them too, receive the tasks others read for it, and deliver every range to its
destinations (:mod:`ckptio.engine.restore.destinations`).

Pipelined and bounded: up to ``concurrency`` requests are in flight at once (reads on a thread pool, receives
posted on the side group) while the oldest one is verified, sent and delivered. A request is one task, or — on a
store that charges per request (``Storage.read_batch_bytes``) — adjacent tasks this rank reads into their targets'
own memory, fetched together. A task that lands in a target's own
memory needs no buffer; every other task takes one of ``concurrency`` reusable bounce buffers of ``chunk`` bytes
(pinned when a target is on a GPU), returned once its sends and copies are done. A restore therefore holds at
most ``concurrency × chunk`` bytes beyond its targets, whatever the file sizes (gathered items — objects, strided
or legacy ones — excepted: they hold their own bytes until complete, and a legacy file is read whole).

Every rank walks its tasks in the plan's global order and only ever waits for tasks of lower or equal id, so the
exchange cannot deadlock. A read that fails on every source does not stop the walk: the rank still sends what it
has (the receivers' own checks reject it), finishes its schedule so no peer waits forever, and raises at the end.
Receivers verify every block too, so a byte is never used unless a checksum covered it where it is used.
A rank found gone mid-walk (:mod:`ckptio.engine.restore.peer_links`) is skipped from then on: the walk still
finishes for the live ranks, then raises :class:`~ckptio.errors.PeerLostError` naming it.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch

from ckptio.engine.restore.destinations import Dest, tensor_bytes
from ckptio.engine.restore.peer_links import PeerLinks, Posted
from ckptio.engine.restore.read_plan import MAX_GAP, Task
from ckptio.errors import ChecksumError, CkptError, StorageError
from ckptio.format.blocks import crc32c
from ckptio.format.keys import step_dir
from ckptio.storage.base import join_key


@dataclass(frozen=True, slots=True)
class Source:
    """One place a file's bytes can be read from: ``read(offset, buffers) -> bytes read``."""

    label: str
    read: Callable[[int, list[memoryview]], int]


def bad_block(view: memoryview, task: Task) -> tuple[Any, int] | None:
    """The first block of ``task`` whose bytes in ``view`` fail their checksum, with the crc found."""
    for block in task.blocks:
        if not block.crc:  # a plain DCP item: its zip CRC-32 is checked once it is gathered
            continue
        start = block.offset - task.offset
        found = crc32c(view[start : start + block.length])
        if found != int(block.crc, 16):
            return block, found
    return None


@dataclass(slots=True)
class _Flight:
    task: Task
    view: memoryview
    buffer: torch.Tensor | None
    direct: Dest | None = None
    """The destination whose own memory ``view`` is (nothing to copy), or None for a bounce buffer."""
    read: Future[list[str | BaseException]] | None = None
    """The read of this task, alone or with adjacent ones; ``slot`` is its place in the outcome."""
    slot: int = 0
    recv: Posted | None = None
    sends: list[Posted] = field(default_factory=list)
    """Sends to other ranks that still use ``view``."""
    waits: list[Any] = field(default_factory=list)
    """Side-stream copies (CUDA events) that still use ``view``."""


class Tally(Protocol):
    """Who hears what a transfer moved: a task read from a source (by its label), or received from its reader."""

    def read(self, task: Task, label: str) -> None: ...

    def received(self, task: Task) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferSpec:
    """Where one rank's transfer runs and how hard it pushes."""

    rank: int
    """This rank in ``group``."""
    group: Any
    """The process group the ranges move on (None: one process, nothing moves)."""
    step: int
    root: str
    """The step and the store's URL, for errors."""
    concurrency: int
    chunk: int
    """Requests in flight, and the size of each of the ``concurrency`` bounce buffers."""
    pinned: bool
    """Bounce buffers in pinned memory (a target is on a GPU)."""
    batch_bytes: int = 0
    """Adjacent tasks this rank reads into their targets' memory are read in one request up to this many bytes
    (``ReadStore.read_batch_bytes``: stores that charge per request)."""


class Transfer:
    """Runs one rank's tasks; ``sources(file)`` lists where a file can be read, best first; ``tally`` hears what
    was read and received."""

    def __init__(self, spec: TransferSpec, sources: Callable[[str], Sequence[Source]], tally: Tally) -> None:
        self.rank, self.group, self.step, self.root = spec.rank, spec.group, spec.step, spec.root
        self.batch_bytes, self.concurrency, self.chunk = spec.batch_bytes, max(1, spec.concurrency), spec.chunk
        self.pinned, self.sources, self.tally = spec.pinned, sources, tally
        self.links = PeerLinks(spec.group, step=spec.step, root=spec.root)
        self.errors: list[BaseException] = []
        self._free: list[torch.Tensor] = []
        self._made = 0
        self._held: deque[_Flight] = deque()

    # ---- buffers ------------------------------------------------------------------------------------------
    def _new_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned)

    def _acquire(self, nbytes: int) -> torch.Tensor:
        if nbytes > self.chunk:  # a legacy whole file: its own buffer, freed with the task
            return self._new_buffer(nbytes)
        while not self._free and self._made >= self.concurrency and self._held:
            self._release(self._held.popleft())
        if self._free:
            return self._free.pop()
        self._made += 1
        return self._new_buffer(self.chunk)

    def _release(self, flight: _Flight) -> None:
        for send in flight.sends:
            self.links.wait(send)
        for event in flight.waits:
            event.synchronize()
        flight.sends.clear()
        flight.waits.clear()
        if flight.buffer is not None and flight.buffer.numel() == self.chunk:
            self._free.append(flight.buffer)

    def _sweep(self) -> None:
        """Return the buffers of finished tasks whose sends and copies are done, without waiting."""
        while self._held and all(map(self.links.done, self._held[0].sends)) and all(
                w.query() for w in self._held[0].waits):
            self._release(self._held.popleft())

    # ---- one task -----------------------------------------------------------------------------------------
    def _read(self, task: Task, view: memoryview) -> str:
        """Read ``task`` into ``view`` from the first source whose bytes pass every block check. When none does,
        the error is the first block that failed (naming the item), with what every other source said."""
        errors: list[BaseException] = []
        for source in self.sources(task.file):
            try:
                got = source.read(task.offset, [view])
            except (CkptError, OSError) as exc:
                errors.append(exc)
                continue
            if got != task.length:
                errors.append(StorageError(f"{task.file}: read {got} of {task.length} bytes at {task.offset} from "
                                           f"{source.label}", root=self.root, step=self.step, path=self._path(task)))
                continue
            bad = bad_block(view, task)
            if bad is None:
                return source.label
            errors.append(self._checksum_error(task, bad, f"read from {source.label}"))
        if not errors:
            raise StorageError(f"{task.file}: no source to read it from", root=self.root, step=self.step)
        first = next((e for e in errors if isinstance(e, ChecksumError) and e.path == self._path(task)), errors[0])
        others = [e for e in errors if e is not first]
        if isinstance(first, CkptError) and others:
            detail = "; ".join(f"{type(e).__name__}: {e}" for e in others)
            raise type(first)(f"{first.message} (other sources: {detail})", **first.context)
        raise first

    def _checksum_error(self, task: Task, bad: tuple[Any, int], where: str, *,
                        sender: int | None = None) -> ChecksumError:
        block, found = bad
        return ChecksumError(f"{block.what!r}: bytes {block.offset}..{block.offset + block.length} of {task.file} "
                             f"{where}: crc32c {found:08x}, recorded {block.crc}", root=self.root, step=self.step,
                             path=self._path(task), rank=sender)

    def _path(self, task: Task) -> str:
        return join_key(step_dir(self.step), task.file)

    def _read_batch(self, items: list[tuple[Task, memoryview]]) -> list[str | BaseException]:
        """Adjacent tasks in one request (the gaps between them, torch.save's framing, read into scratch); a task
        whose blocks fail, or a request that fails, is read again alone from every source."""
        outcome: list[str | BaseException | None] = [None] * len(items)
        if len(items) > 1:
            views, pos = [], items[0][0].offset
            for task, view in items:
                if task.offset > pos:
                    views.append(memoryview(bytearray(task.offset - pos)))
                views.append(view)
                pos = task.end
            source = self.sources(items[0][0].file)[0]
            try:
                if source.read(items[0][0].offset, views) == pos - items[0][0].offset:
                    outcome = [source.label if bad_block(v, t) is None else None for t, v in items]
            except (CkptError, OSError):
                pass
        for i, (task, view) in enumerate(items):
            if outcome[i] is None:
                try:
                    outcome[i] = self._read(task, view)
                except BaseException as exc:  # handed to the walk, which records it and goes on
                    outcome[i] = exc
        return cast(list[str | BaseException], outcome)

    def _flight(self, task: Task, dests: list[Dest]) -> _Flight:
        view = dests[0].view(task.offset, task.length) if len(dests) == 1 and task.gapless else None
        if view is not None:
            return _Flight(task, view, None, direct=dests[0])
        buffer = self._acquire(task.length)
        return _Flight(task, tensor_bytes(buffer, task.length), buffer)

    def _start(self, queue: deque[Task], of_task: dict[int, list[Dest]], pool: ThreadPoolExecutor) -> list[_Flight]:
        """Start the next task, with the adjacent direct reads that follow it when the store wants batches."""
        task = queue.popleft()
        flights = [self._flight(task, of_task[task.id])]
        if task.reader != self.rank:
            flights[0].recv = self.links.recv(flights[0].view, task.reader, task.id)
            return flights
        while flights[0].direct is not None and queue:  # direct: a batch holds no bounce buffer
            last, nxt = flights[-1].task, queue[0]
            dests = of_task[nxt.id]
            if not (nxt.reader == self.rank and nxt.file == task.file and 0 <= nxt.offset - last.end <= MAX_GAP
                    and nxt.end - task.offset <= self.batch_bytes and len(dests) == 1
                    and dests[0].view(nxt.offset, nxt.length) is not None and nxt.gapless):
                break
            flights.append(self._flight(queue.popleft(), dests))
        future = pool.submit(self._read_batch, [(f.task, f.view) for f in flights])
        for slot, flight in enumerate(flights):
            flight.read, flight.slot = future, slot
        return flights

    def _landed(self, flight: _Flight) -> bool:
        """Whether ``flight``'s bytes are in and pass their checks (a read, sent on to its receivers whatever the
        outcome, or a receive); a failure is recorded for the end of the walk."""
        task, view = flight.task, flight.view
        if flight.read is not None:
            outcome = flight.read.result()[flight.slot]
            for peer in task.receivers:  # even after a failure: the peer's own check rejects the bytes
                flight.sends.append(self.links.send(view, peer, task.id))
            if isinstance(outcome, BaseException):  # recorded; the schedule goes on so no peer waits forever
                self.errors.append(outcome)
                return False
            self.tally.read(task, outcome)
            return True
        assert flight.recv is not None
        if not self.links.wait(flight.recv):  # its reader is gone: PeerLinks recorded it
            return False
        bad = bad_block(view, task)
        if bad is not None:
            self.errors.append(self._checksum_error(task, bad, f"received from rank {task.reader}",
                                                    sender=task.reader))
            return False
        self.tally.received(task)
        return True

    def _finish(self, flight: _Flight, dests: list[Dest], done: Callable[[Dest], None]) -> None:
        task, view = flight.task, flight.view
        if self._landed(flight):
            for dest in dests:
                lo, hi = max(task.offset, dest.lo), min(task.end, dest.hi)
                if lo >= hi:
                    continue
                if dest is not flight.direct:
                    flight.waits += dest.accept(task.offset, view)
                dest.remaining -= hi - lo
                if dest.remaining == 0:
                    done(dest)
        self._held.append(flight)

    # ---- the walk -----------------------------------------------------------------------------------------
    def run(self, tasks: Sequence[Task], dests: Sequence[Dest], done: Callable[[Dest], None]) -> None:
        """Every task in id order, ``concurrency`` in flight; ``done(dest)`` once a destination has all its bytes.
        Raises the first error once the whole schedule ran."""
        of_task = _dests_by_task(tasks, dests)
        queue = deque(tasks)
        flying: deque[list[_Flight]] = deque()  # requests in flight: one task, or adjacent direct reads batched
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="ckptio-read") as pool:
            while queue or flying:
                while queue and len(flying) < self.concurrency:
                    flying.append(self._start(queue, of_task, pool))
                for flight in flying.popleft():
                    self._finish(flight, of_task[flight.task.id], done)
                self._sweep()
        while self._held:
            self._release(self._held.popleft())
        if self.links.lost:  # the cause of whatever else failed: name the rank that is gone
            raise next(iter(self.links.lost.values()))
        if self.errors:
            raise self.errors[0]


def _dests_by_task(tasks: Sequence[Task], dests: Sequence[Dest]) -> dict[int, list[Dest]]:
    """The destinations each task feeds (a rank's tasks of one file never overlap: bisect on their offsets)."""
    by_file: dict[str, list[Task]] = {}
    for task in tasks:
        by_file.setdefault(task.file, []).append(task)
    starts = {name: [t.offset for t in ts] for name, ts in by_file.items()}
    for ts in by_file.values():
        ts.sort(key=lambda t: t.offset)
    for name in starts:
        starts[name] = [t.offset for t in by_file[name]]
    out: dict[int, list[Dest]] = {t.id: [] for t in tasks}
    for dest in dests:
        if dest.lo >= dest.hi or dest.file not in by_file:
            continue
        ts, offs = by_file[dest.file], starts[dest.file]
        i = max(bisect.bisect_right(offs, dest.lo) - 1, 0)
        while i < len(ts) and ts[i].offset < dest.hi:
            if ts[i].end > dest.lo:
                out[ts[i].id].append(dest)
            i += 1
    return out
