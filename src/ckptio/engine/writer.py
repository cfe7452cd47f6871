"""The job pipeline of one rank's writer: staging slot → serialized data files → tiers → rank index.

Per :class:`~ckptio.engine.protocol.SaveJob`, in order: serialize each data file straight from the shared-memory
slot, write it to the first tier (local if configured, else durable), give the slot back as soon as the bytes are
safe, upload from the local tier, then write this rank's index to the durable tier and hand the save to the
:class:`~ckptio.engine.committer.Committer`. The process around it (message loop, priority) is
``engine.writer_main``.

Full disks: a failed save's data files are deleted from both tiers at once. A local tier that runs out of space
(ENOSPC, not the ``local_capacity_bytes`` budget) evicts its older, already committed steps and tries again; when
that is not enough the save goes to the durable tier only, with a ``local_tier_full`` warning event.

It must never touch the training process group, commit a step, or delete a committed one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor

from ckptio.engine.committer import CommitRequest, Committer, discard_attempt, report_failure
from ckptio.engine.live import LiveSteps
from ckptio.engine.protocol import Outbox, SaveJob, SlotFree, WriterPlan, WriterStart
from ckptio.engine.replica import LocalLevel
from ckptio.errors import StorageError, StorageFullError
from ckptio.format import (
    FileRecord,
    ItemRecord,
    RankIndex,
    all_step_dirs,
    durable_data_key,
    index_key,
    manifest_key,
    step_dir,
    write_failure,
)
from ckptio.format.blocks import BLOCK_SIZE, RunningChecksum
from ckptio.format.layout import TensorEntry, data_file_name
from ckptio.format.serialize import TensorFramer
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import Storage, join_key


def _serialize_tensor(framer: TensorFramer, buf: mmap.mmap,
                      entry: TensorEntry) -> tuple[list[bytes | memoryview], int | None]:
    # The slot's bytes of just this tensor, framed as torch.save would write it (no torch in this process).
    raw = memoryview(buf)[entry.slot_offset : entry.slot_offset + entry.nbytes]
    return framer.frame_item(entry.dtype, entry.shape, raw)


class Writer:
    """The body of the writer process (also usable in-process by tests)."""

    def __init__(self, start: WriterStart, out: Outbox, live: LiveSteps | None = None) -> None:
        self.start = start
        self.config = start.config
        self.out = out
        self.live = live or LiveSteps()
        self._maps: dict[str, mmap.mmap] = {}
        self._pool = ThreadPoolExecutor(max_workers=self.config.upload_concurrency, thread_name_prefix="ckptio-up")
        self._committer = Committer(start, out, self.live)
        self._last_residency_check = 0.0
        self._plans: dict[int, WriterPlan] = {}
        self._framer = TensorFramer()
        self._levels = LocalLevel(start, out) if start.levels is not None else None  # issue 10

    def add_plan(self, plan: WriterPlan) -> None:
        self._plans = {plan.plan_id: plan}  # jobs are in order, so older plans are never referenced again

    # ---- per job ----------------------------------------------------------------------------------------------
    def run_job(self, job: SaveJob) -> None:
        """Run one save up to its commit request; ``job.step`` is live (registered by the caller) until the
        committer, or the failure path here, reports the outcome."""
        rank, durable = self.start.rank, self.start.durable
        slot_freed = False
        plan = self._plans.get(job.plan_id)
        try:
            if plan is None:
                raise StorageError(f"no plan {job.plan_id} for this save", step=job.step, rank=rank)
            self._check_residency()
            buf = self._map(job.slot_path, job.slot_nbytes)
            self._make_local_room(job, plan)
            files, items, local = self._write_first_tier(job, plan, buf)
            if local is not None:
                # The snapshot is safe on the local tier (NVMe/RAM) once written: free the slot before uploading.
                self.out.send(SlotFree(job.step, job.save_id, job.slot_id))
                slot_freed = True
                if self._levels is not None and job.local_level:  # issue 10: partners + local-level commit
                    self._levels.run(job, plan.metadata_skeleton, files, items)
                if not job.durable:
                    self.live.remove(job.step)  # a local-level-only save ends here: nothing for the committer
                    return
                self._upload_from_local(job, files, local)
            index = RankIndex(step=job.step, rank=rank, world_size=self.start.world_size,
                              save_id=job.save_id, files=files, items=items)
            t0 = time.monotonic()
            durable.put(index_key(job.step, rank), index.to_json())
            self.out.event(Event.PHASE, job.step, phase=Phase.RANK_INDEX, seconds=time.monotonic() - t0, bytes=0,
                           tier="durable")
            if not slot_freed:
                self.out.send(SlotFree(job.step, job.save_id, job.slot_id))
                slot_freed = True
            self._committer.submit(CommitRequest(step=job.step, save_id=job.save_id,
                                                 metadata_skeleton=plan.metadata_skeleton,
                                                 n_files=plan.layout.n_files, rollback=job.rollback,
                                                 replaces=job.replaces))
        except BaseException as exc:
            if not slot_freed:
                self.out.send(SlotFree(job.step, job.save_id, job.slot_id))
            write_failure(durable, job.step, f"rank{rank}", job.save_id, exc)
            if plan is not None:
                discard_attempt(self.start, job.step, job.save_id, plan.layout.n_files)
            self.live.remove(job.step)
            report_failure(self.out, self.start, job.step, job.save_id, exc)

    def _write_first_tier(self, job: SaveJob, plan: WriterPlan,
                          buf: mmap.mmap) -> tuple[list[FileRecord], list[ItemRecord], Storage | None]:
        """Write the files to the local tier, else (none, or no room even after eviction) to the durable one.
        Returns the files, their items and the tier they are on when it is the local one."""
        local = self.start.local
        if local is None:
            return *self._write_files(job, plan, buf, None), None
        for attempt in range(2):
            try:
                return *self._write_files(job, plan, buf, local), local
            except StorageFullError as exc:
                discard_attempt(self.start, job.step, job.save_id, plan.layout.n_files)
                if attempt == 0 and self._evict_committed_local(job.step):
                    continue
                self.out.event(Event.LOCAL_TIER_FULL, job.step, error=str(exc))
                break
        return *self._write_files(job, plan, buf, None), None

    def _evict_committed_local(self, below: int) -> bool:
        """Free the local tier for a save of ``below``: drop its older steps that are committed on the durable
        tier and not in flight. True when something was deleted."""
        local, durable = self.start.local, self.start.durable
        assert local is not None
        evicted = False
        with self.live.cleaning() as live:
            for step in all_step_dirs(local):
                if step < below and step not in live and durable.exists(manifest_key(step)):
                    local.delete_prefix(step_dir(step))
                    evicted = True
        return evicted

    def _make_local_room(self, job: SaveJob, plan: WriterPlan) -> None:
        """Keep the local tier within its budget: evict steps that are already durable, else refuse this save."""
        local, budget = self.start.local, self.config.local_capacity_bytes
        if local is None or budget is None:
            return
        # Serialized files are the raw tensor bytes plus a few KiB of framing per tensor.
        layout = plan.layout
        need = layout.tensor_bytes + sum(map(len, job.objects)) + 4096 * (len(layout.tensors) + 1)
        if need > budget:  # hopeless: keep what the tier holds (a restore may still want it)
            raise StorageFullError(f"local tier budget exhausted: this save needs {need:,} bytes of {budget:,}",
                                   root=local.url, step=job.step, rank=self.start.rank)
        with self.live.cleaning() as live:
            for step in all_step_dirs(local):
                used = sum(i.size for i in local.list(""))
                if used + need <= budget:
                    return
                if step < job.step and step not in live and self.start.durable.exists(manifest_key(step)):
                    local.delete_prefix(step_dir(step))
        used = sum(i.size for i in local.list(""))
        if used + need > budget:
            raise StorageFullError(
                f"local tier budget exhausted: {used + need:,} bytes needed of {budget:,}",
                root=local.url, step=job.step, rank=self.start.rank,
            )

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

    def _write_files(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap,
                     local: Storage | None) -> tuple[list[FileRecord], list[ItemRecord]]:
        """Serialize each file and write it to ``local`` (else durable), concurrently."""
        futures = [self._pool.submit(self._write_one_file, job, plan, buf, n, local)
                   for n in range(plan.layout.n_files)]
        concurrent.futures.wait(futures)  # every write ended before a failure is handled (and its files deleted)
        files, items = [], []
        for fut in futures:
            rec, its = fut.result()
            files.append(rec)
            items.extend(its)
        return files, items

    def _write_one_file(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap, n: int,
                        local: Storage | None) -> tuple[FileRecord, list[ItemRecord]]:
        target: Storage = local or self.start.durable
        tier = "local" if local is not None else "durable"
        name = data_file_name(self.start.rank, n, job.save_id)
        t0 = time.monotonic()
        blobs: list[bytes | memoryview] = []
        items: list[ItemRecord] = []
        offset = 0
        # One pass gives the file's crc32c and each item's block checksums (ranged restores verify with those).
        running = RunningChecksum()
        if n == 0:
            for obj, payload in zip(plan.layout.objects, job.objects, strict=True):
                blobs.append(payload)
                items.append(ItemRecord(fqn=obj.fqn, offset=None, index_hint=obj.index_hint, file=name,
                                        file_offset=offset, length=len(payload), block_size=BLOCK_SIZE,
                                        crc32c=running.add_item([payload], 0, len(payload))))
                offset += len(payload)
        for entry in plan.layout.tensors:
            if entry.file_no != n:
                continue
            parts, data_offset = _serialize_tensor(self._framer, buf, entry)
            length = sum(memoryview(p).nbytes for p in parts)
            start, checked = (0, length) if data_offset is None else (data_offset, entry.nbytes)
            blobs.extend(parts)
            items.append(ItemRecord(fqn=entry.fqn, offset=list(entry.chunk_offset), index_hint=entry.index_hint,
                                    file=name, file_offset=offset, length=length, data_offset=data_offset,
                                    data_length=entry.nbytes if data_offset is not None else 0,
                                    block_size=BLOCK_SIZE, crc32c=running.add_item(parts, start, checked)))
            offset += length
        crc = running.hex
        t1 = time.monotonic()
        self.out.event(Event.PHASE, job.step, phase=Phase.SERIALIZE, seconds=t1 - t0, bytes=offset, tier=tier,
                       file=name)
        plain = join_key(step_dir(job.step), name)
        durable_key = durable_data_key(self.start.durable, job.step, name)
        target.put(plain if local is not None else durable_key, blobs)
        self.out.event(Event.PHASE, job.step, phase=Phase.LOCAL_WRITE if local is not None else Phase.UPLOAD,
                       seconds=time.monotonic() - t1, bytes=offset, tier=tier, file=name)
        record_key = durable_key if durable_key != plain else ""
        return FileRecord(name=name, size=offset, crc32c=crc, key=record_key), items

    def _upload_from_local(self, job: SaveJob, files: list[FileRecord], local: Storage) -> None:
        durable = self.start.durable

        def upload(rec: FileRecord) -> None:
            key = join_key(step_dir(job.step), rec.name)
            target = rec.key or key
            t0 = time.monotonic()
            if local.is_posix:
                durable.put_file(target, local.local_path(key))
            else:
                durable.put(target, local.get(key))
            self.out.event(Event.PHASE, job.step, phase=Phase.UPLOAD, seconds=time.monotonic() - t0,
                           bytes=rec.size, tier="durable", file=rec.name)

        futures = [self._pool.submit(upload, rec) for rec in files]
        concurrent.futures.wait(futures)  # all uploads ended before a failure deletes this attempt's files
        for fut in futures:
            fut.result()

    def _check_residency(self) -> None:
        if self.config.residency is None:
            return
        now = time.monotonic()
        if now - self._last_residency_check < self.config.residency_recheck_s and self._last_residency_check:
            return
        from ckptio.policy.residency import check_residency

        check_residency(self.start.durable, self.config.residency)
        self._last_residency_check = now

    def close(self) -> None:
        """Finish the queued commits, then release the threads and the slot mappings."""
        self._committer.close()
        if self._levels is not None:
            self._levels.close()
        self._pool.shutdown(wait=True)
        for buf in self._maps.values():
            with contextlib.suppress(BufferError):
                buf.close()
