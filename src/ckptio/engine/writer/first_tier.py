"""The shared part of every save: serialize the staging slot into data files on the first tier.

The first tier is this rank's local tier when there is one (NVMe or RAM: the slot is free as soon as the bytes are
there), else the durable root. A local tier that runs out of space (ENOSPC, not the ``local_capacity_bytes``
budget) evicts older superseded steps (``LocalTier.free_for``) and is tried once more; when that is not enough a
save that also goes to the durable level is written there instead, with a ``local_tier_full`` warning event, and any
other save fails. A write that fails deletes what it wrote before it raises: whichever level then fails the save
finds nothing of it on the first tier.

Each data file is serialized straight from the shared-memory slot in one pass, which also gives the file's crc32c and
each item's block checksums. It must never write a rank index, commit, or read the slot after handing it back.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from dataclasses import dataclass

from ckptio.engine.protocol import Outbox, SaveJob, SlotFree, WriterPlan, WriterStart
from ckptio.engine.writer.flush_pacer import PacedFlush
from ckptio.engine.writer.flushes import Flushes
from ckptio.engine.writer.local_tier import LocalTier
from ckptio.errors import StorageError, StorageFullError
from ckptio.format import FileRecord, ItemRecord, durable_data_key, step_dir
from ckptio.format.blocks import BLOCK_SIZE, RunningChecksum
from ckptio.format.layout import TensorEntry, data_file_name
from ckptio.format.rollback import delete_data_files
from ckptio.format.serialize import TensorFramer
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import Storage, join_key


class Slot:
    """The staging slot of one job: given back to the trainer once (``SlotFree``), as soon as nothing reads it."""

    def __init__(self, out: Outbox, job: SaveJob) -> None:
        self.out, self.job, self.freed = out, job, False

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.out.send(SlotFree(self.job.step, self.job.save_id, self.job.slot_id))


@dataclass(frozen=True, slots=True)
class SavedFiles:
    """A job after its shared part: its files on the first tier, their records, and its slot (still held unless
    ``on_local``: the durable level frees it once its upload no longer needs it)."""

    job: SaveJob
    plan: WriterPlan
    files: list[FileRecord]
    items: list[ItemRecord]
    on_local: bool
    """The files are on the local tier (else on the durable root, under their durable keys)."""
    slot: Slot


class FirstTier:
    """Writes a job's data files to the local tier, else the durable root."""

    def __init__(self, start: WriterStart, out: Outbox, flushes: Flushes, local_tier: LocalTier | None) -> None:
        self.start, self.out, self.flushes, self.local_tier = start, out, flushes, local_tier
        self._maps: dict[str, mmap.mmap] = {}
        self._framer = TensorFramer()

    def write(self, job: SaveJob, plan: WriterPlan, slot: Slot, *, fallback: bool) -> SavedFiles:
        """The job's files on the local tier, else (none, or no room even after eviction, and ``fallback``) on the
        durable root. Frees the slot once the files are on the local tier."""
        buf = self._map(job.slot_path, job.slot_nbytes)
        tier = self.local_tier
        if tier is not None:
            tier.make_room(job.step, _bytes_needed(job, plan))
            for attempt in range(2):
                try:
                    with self.flushes.flush(job, "local", paced=self.start.config.flush_pace_local) as flush:
                        files, items = self._write_files(job, plan, buf, tier.storage, flush)
                    slot.free()  # the snapshot is safe on NVMe/RAM: free the slot before anything else
                    return SavedFiles(job, plan, files, items, on_local=True, slot=slot)
                except StorageFullError as exc:
                    if attempt == 0 and tier.free_for(job.step):
                        continue
                    if not fallback:
                        raise
                    self.out.event(Event.LOCAL_TIER_FULL, job.step, error=str(exc))
                    break
        with self.flushes.flush(job, "durable") as flush:
            files, items = self._write_files(job, plan, buf, None, flush)
        return SavedFiles(job, plan, files, items, on_local=False, slot=slot)

    def _write_files(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap, local: Storage | None,
                     flush: PacedFlush) -> tuple[list[FileRecord], list[ItemRecord]]:
        """Serialize each file and write it to ``local`` (else durable), concurrently; on a failure, delete every
        file of the attempt from that tier first."""
        try:
            written = self.flushes.run_all(lambda n: self._write_one_file(job, plan, buf, n, _To(local, flush)),
                                           range(plan.layout.n_files))
        except BaseException:
            names = [data_file_name(self.start.rank, n, job.save_id) for n in range(plan.layout.n_files)]
            if local is not None and self.local_tier is not None:
                self.local_tier.discard(job.step, names)
            else:
                with contextlib.suppress(StorageError):
                    delete_data_files(self.start.durable, job.step, names)
            raise
        return [rec for rec, _ in written], [item for _, items in written for item in items]

    def _write_one_file(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap, n: int,
                        to: _To) -> tuple[FileRecord, list[ItemRecord]]:
        local, flush = to.local, to.flush
        target: Storage = local or self.start.durable
        tier = "local" if local is not None else "durable"
        name = data_file_name(self.start.rank, n, job.save_id)
        t0 = time.monotonic()
        blobs, items = self._serialize(job, plan, buf, n, name)
        size = sum(item.length for item in items)
        t1 = time.monotonic()
        self.out.event(Event.PHASE, job.step, phase=Phase.SERIALIZE, seconds=t1 - t0, bytes=size, tier=tier,
                       file=name)
        plain = join_key(step_dir(job.step), name)
        durable_key = durable_data_key(self.start.durable, job.step, name)
        target.put(plain if local is not None else durable_key, blobs.parts, pacer=flush.pacer)
        self.out.event(Event.PHASE, job.step, phase=Phase.LOCAL_WRITE if local is not None else Phase.UPLOAD,
                       seconds=time.monotonic() - t1, bytes=size, tier=tier, file=name)
        stored_key = durable_key if durable_key != plain else ""  # the upload from the local tier goes there too
        return FileRecord(name=name, size=size, crc32c=blobs.crc, key=stored_key), items

    def _serialize(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap, n: int,
                   name: str) -> tuple[_Blobs, list[ItemRecord]]:
        """File ``n``'s pieces as torch.save would frame them; one pass gives the file's crc32c and each item's
        block checksums (ranged restores verify with those)."""
        parts: list[bytes | memoryview] = []
        items: list[ItemRecord] = []
        offset = 0
        running = RunningChecksum()
        if n == 0:
            for obj, payload in zip(plan.layout.objects, job.objects, strict=True):
                parts.append(payload)
                items.append(ItemRecord(fqn=obj.fqn, offset=None, index_hint=obj.index_hint, file=name,
                                        file_offset=offset, length=len(payload), block_size=BLOCK_SIZE,
                                        crc32c=running.add_item([payload], 0, len(payload))))
                offset += len(payload)
        for entry in plan.layout.tensors:
            if entry.file_no != n:
                continue
            framed, data_offset = self._frame(buf, entry)
            length = sum(memoryview(p).nbytes for p in framed)
            start, checked = (0, length) if data_offset is None else (data_offset, entry.nbytes)
            parts.extend(framed)
            items.append(ItemRecord(fqn=entry.fqn, offset=list(entry.chunk_offset), index_hint=entry.index_hint,
                                    file=name, file_offset=offset, length=length, data_offset=data_offset,
                                    data_length=entry.nbytes if data_offset is not None else 0,
                                    block_size=BLOCK_SIZE, crc32c=running.add_item(framed, start, checked)))
            offset += length
        return _Blobs(parts, running.hex), items

    def _frame(self, buf: mmap.mmap, entry: TensorEntry) -> tuple[list[bytes | memoryview], int | None]:
        # The slot's bytes of just this tensor, framed as torch.save would write it (no torch in this process).
        raw = memoryview(buf)[entry.slot_offset : entry.slot_offset + entry.nbytes]
        return self._framer.frame_item(entry.dtype, entry.shape, raw)

    def _map(self, path: str, nbytes: int) -> mmap.mmap:
        buf = self._maps.get(path)
        if buf is None:
            for old in [p for p in self._maps if not os.path.exists(p)]:
                with contextlib.suppress(BufferError):  # a view still alive: the GC unmaps it later
                    self._maps.pop(old).close()
            # Mapped writable only because torch.frombuffer warns on read-only buffers; the writer never writes it.
            fd = os.open(path, os.O_RDWR)
            try:
                buf = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
            finally:
                os.close(fd)
            self._maps[path] = buf
        return buf

    def close(self) -> None:
        for buf in self._maps.values():
            with contextlib.suppress(BufferError):
                buf.close()


@dataclass(frozen=True, slots=True)
class _To:
    """Where one flush writes: the local tier's storage (None: the durable root), and its pace."""

    local: Storage | None
    flush: PacedFlush


@dataclass(frozen=True, slots=True)
class _Blobs:
    parts: list[bytes | memoryview]
    crc: str


def _bytes_needed(job: SaveJob, plan: WriterPlan) -> int:
    # Serialized files are the raw tensor bytes plus a few KiB of framing per tensor.
    layout = plan.layout
    return layout.tensor_bytes + sum(map(len, job.objects)) + 4096 * (len(layout.tensors) + 1)
