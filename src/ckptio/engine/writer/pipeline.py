"""The job pipeline of one rank's writer: staging slot → serialized data files → tiers → rank index → commit.

Per :class:`~ckptio.engine.protocol.SaveJob`, in order: serialize each data file straight from the shared-memory
slot, write it to the first tier (local if configured, else durable), give the slot back as soon as the bytes are
safe, hand a local-level save to the local level (its copies to partners and its commit run on that level's own
thread), upload a durable save from the local tier, write this rank's index to the durable root and hand the save
to the durable level's :class:`~ckptio.engine.writer.step_committer.StepCommitter`. The process around it (message loop,
priority) is ``engine.writer.process``; the local directory's space belongs to ``engine.writer.local_tier``.

Failures stay with the level they hit: a failure before the files are written fails the save on every level it
goes to (markers in each level's records, its files deleted); an upload or durable index that fails fails the
durable level only, and the local level goes on. Full disks: a local tier that runs out of space (ENOSPC, not the
``local_capacity_bytes`` budget) evicts older superseded steps and tries again; when that is not enough a durable
save goes to the durable tier only, with a ``local_tier_full`` warning event, and a local-only save fails.

It must never touch the training process group, commit a step, or delete a committed one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import mmap
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from ckptio.engine.failure_markers import FailureMarkers, level_only
from ckptio.engine.protocol import JobLevels, Outbox, SaveJob, SlotFree, WriterPlan, WriterStart
from ckptio.engine.writer.flush_pacer import FlushPacer, PacedFlush
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.local_level_writer import LocalLevelWriter
from ckptio.engine.writer.local_tier import LocalTier
from ckptio.engine.writer.step_committer import (
    CommitLevel,
    CommitRequest,
    StepCommitter,
    discard_attempt,
    report_failure,
)
from ckptio.errors import StorageError, StorageFullError
from ckptio.format import (
    FileRecord,
    ItemRecord,
    RankIndex,
    durable_data_key,
    index_key,
    record_key,
    step_dir,
)
from ckptio.format.blocks import BLOCK_SIZE, RunningChecksum
from ckptio.format.layout import TensorEntry, data_file_name
from ckptio.format.local_level import local_records
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
        self._last_residency_check = 0.0
        self._plans: dict[int, WriterPlan] = {}
        self._framer = TensorFramer()
        self.pacer = FlushPacer()
        records = local_records(start.durable) if start.levels is not None else None
        self.local_tier = None if start.local is None else LocalTier(
            start.local, durable=start.durable, local_records=records, live=self.live,
            budget=self.config.local_capacity_bytes, rank=start.rank)
        evict = self.local_tier.evict_below if self.local_tier is not None else None
        self.markers = FailureMarkers(start.durable, records)
        self._durable = StepCommitter(CommitLevel("durable", start.durable, keep_last=self.config.keep_last,
                                                  retire_also=(records,) if records is not None else (),
                                                  after_commit=evict), start, out, self.live, markers=self.markers)
        self._local: StepCommitter | None = None
        self._local_writer: LocalLevelWriter | None = None
        if records is not None:
            self._local_writer = LocalLevelWriter(start, out, records, self.pacer)
            # The local level keeps its newest step only: it is the fast way back, the durable level the safe one.
            self._local = StepCommitter(CommitLevel("local", records, keep_last=1, retire_also=(start.durable,),
                                                    after_commit=evict), start, out, self.live, markers=self.markers)

    def add_plan(self, plan: WriterPlan) -> None:
        self._plans = {plan.plan_id: plan}  # jobs are in order, so older plans are never referenced again

    def _levels(self, job: SaveJob) -> JobLevels:
        return job.levels if self._local is not None else JobLevels()

    # ---- per job ----------------------------------------------------------------------------------------------
    def run_job(self, job: SaveJob) -> None:
        """Run one save up to its commit requests; ``job.step`` is live (registered by the caller, once) until
        each level's committer, or a failure path here, reports that level's outcome."""
        self.pacer.job_started()
        levels = self._levels(job)
        if levels.durable and levels.local:
            self.live.add(job.step)  # one registration per level: each level's outcome removes its own
        slot = _Slot(self.out, job)
        plan = self._plans.get(job.plan_id)
        try:
            if plan is None:
                raise StorageError(f"no plan {job.plan_id} for this save", step=job.step, rank=self.start.rank)
            self._check_residency()
            buf = self._map(job.slot_path, job.slot_nbytes)
            if self.local_tier is not None:
                self.local_tier.make_room(job.step, self._bytes_needed(job, plan))
            files, items, on_local = self._write_first_tier(job, plan, buf, fallback=levels.durable)
        except BaseException as exc:
            slot.free()
            self._fail(job, levels, plan.layout.n_files if plan is not None else 0, exc)
            return
        if on_local:
            slot.free()  # the snapshot is safe on the local tier (NVMe/RAM): free the slot before anything else
        if levels.local:
            self._submit_local(job, plan, files, items, on_local=on_local, reports=not levels.durable)
        if levels.durable:
            self._durable_part(job, plan, files, items, on_local=on_local, slot=slot)

    def _durable_part(self, job: SaveJob, plan: WriterPlan, files: list[FileRecord], items: list[ItemRecord],
                      *, on_local: bool, slot: _Slot) -> None:
        """Upload (from the local tier), write this rank's durable index, queue the durable commit."""
        rank, durable = self.start.rank, self.start.durable
        tiers = self._discard_tiers(job)
        try:
            if on_local:
                assert self.start.local is not None
                with self._flush(job, "durable") as flush:
                    self._upload_from_local(job, files, self.start.local, flush)
            index = RankIndex(step=job.step, rank=rank, world_size=self.start.world_size,
                              save_id=job.save_id, files=files, items=items)
            t0 = time.monotonic()
            durable.put(index_key(job.step, rank), index.to_json())
            self.out.event(Event.PHASE, job.step, phase=Phase.RANK_INDEX, seconds=time.monotonic() - t0, bytes=0,
                           tier="durable")
        except BaseException as exc:
            slot.free()
            self.markers.mark(level_only("durable"), job.step, f"rank{rank}", job.save_id, exc)  # durable's own part
            discard_attempt(tiers, rank, job.step, job.save_id, plan.layout.n_files)
            self.live.remove(job.step)
            report_failure(self.out, self.start, job.step, job.save_id, exc)
            return
        slot.free()
        self._durable.submit(CommitRequest(step=job.step, save_id=job.save_id,
                                           metadata_skeleton=plan.metadata_skeleton, n_files=plan.layout.n_files,
                                           discard_tiers=tiers, rollback=job.rollback, replaces=job.replaces))

    def _discard_tiers(self, job: SaveJob) -> tuple[Storage, ...]:
        """Where a failed durable attempt's files are deleted: never the local copies a local-level save of the
        same job still uses."""
        local = self.start.local
        if local is None or self._levels(job).local:
            return (self.start.durable,)
        return (local, self.start.durable)

    def _submit_local(self, job: SaveJob, plan: WriterPlan, files: list[FileRecord], items: list[ItemRecord], *,
                      on_local: bool, reports: bool) -> None:
        assert self._local is not None and self._local_writer is not None and self.start.local is not None
        writer = self._local_writer
        if not on_local:  # the local tier was full: this save holds nothing on the local level
            error = StorageFullError("local level: the local tier had no room for this save",
                                     root=self.start.local.url, step=job.step, rank=self.start.rank)
            self._local.submit(CommitRequest(step=job.step, save_id=job.save_id, metadata_skeleton=None,
                                             reports=reports, prepare=_raise(error)))
            return
        self._local.submit(CommitRequest(
            step=job.step, save_id=job.save_id, metadata_skeleton=plan.metadata_skeleton,
            n_files=plan.layout.n_files, discard_tiers=(self.start.local,) if reports else (),
            rollback=job.rollback, replaces=job.replaces, reports=reports,
            prepare=lambda: writer.prepare(job, files, items)))

    def _fail(self, job: SaveJob, levels: JobLevels, n_files: int, exc: BaseException) -> None:
        """The save failed before its files were written: it fails on every level it goes to."""
        rank = self.start.rank
        self.markers.mark(levels, job.step, f"rank{rank}", job.save_id, exc)
        tiers = [t for t in (self.start.local, self.start.durable) if t is not None]
        discard_attempt(tiers, rank, job.step, job.save_id, n_files)
        for wanted in (levels.durable, levels.local):
            if wanted:
                self.live.remove(job.step)
        if levels.local and not levels.durable:
            self.out.event(Event.LEVEL_FAILED, job.step, level="local", error=str(exc), error_type=type(exc).__name__)
        report_failure(self.out, self.start, job.step, job.save_id, exc)

    def _bytes_needed(self, job: SaveJob, plan: WriterPlan) -> int:
        # Serialized files are the raw tensor bytes plus a few KiB of framing per tensor.
        layout = plan.layout
        return layout.tensor_bytes + sum(map(len, job.objects)) + 4096 * (len(layout.tensors) + 1)

    def _write_first_tier(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap, *,
                          fallback: bool) -> tuple[list[FileRecord], list[ItemRecord], bool]:
        """Write the files to the local tier, else (none, or no room even after eviction, and ``fallback``) to the
        durable one, paced as configured. Returns the files, their items, and whether they are on the local tier."""
        local = self.start.local
        if local is not None:
            assert self.local_tier is not None
            for attempt in range(2):
                try:
                    with self._flush(job, "local", paced=self.config.flush_pace_local) as flush:
                        written = self._write_files(job, plan, buf, local, flush)
                    return *written, True
                except StorageFullError as exc:
                    discard_attempt((local,), self.start.rank, job.step, job.save_id, plan.layout.n_files)
                    if attempt == 0 and self.local_tier.free_for(job.step):
                        continue
                    if not fallback:
                        raise
                    self.out.event(Event.LOCAL_TIER_FULL, job.step, error=str(exc))
                    break
        with self._flush(job, "durable") as flush:
            written = self._write_files(job, plan, buf, None, flush)
        return *written, False

    @contextlib.contextmanager
    def _flush(self, job: SaveJob, tier: str, *, paced: bool = True) -> Iterator[PacedFlush]:
        """One flush of ``job`` to ``tier`` at the job's pace (full speed unless ``paced``); a ``flush_paced`` event
        when it went well and was paced."""
        with self.pacer.begin(job.pace_bytes_per_s if paced else None) as flush:
            yield flush
        report = flush.report
        if report is not None:
            self.out.event(Event.FLUSH_PACED, job.step, tier=tier, target_bytes_per_s=report.target_bytes_per_s,
                           achieved_bytes_per_s=report.achieved_bytes_per_s, stretched_s=report.stretched_s,
                           bytes=report.bytes, seconds=report.seconds, hurried=report.hurried)

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

    def _write_files(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap, local: Storage | None,
                     flush: PacedFlush) -> tuple[list[FileRecord], list[ItemRecord]]:
        """Serialize each file and write it to ``local`` (else durable), concurrently."""
        futures = [self._pool.submit(self._write_one_file, job, plan, buf, n, local=local, flush=flush)
                   for n in range(plan.layout.n_files)]
        concurrent.futures.wait(futures)  # every write ended before a failure is handled (and its files deleted)
        files, items = [], []
        for fut in futures:
            rec, its = fut.result()
            files.append(rec)
            items.extend(its)
        return files, items

    def _write_one_file(self, job: SaveJob, plan: WriterPlan, buf: mmap.mmap, n: int, *, local: Storage | None,
                        flush: PacedFlush) -> tuple[FileRecord, list[ItemRecord]]:
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
        target.put(plain if local is not None else durable_key, blobs, pacer=flush.pacer)
        self.out.event(Event.PHASE, job.step, phase=Phase.LOCAL_WRITE if local is not None else Phase.UPLOAD,
                       seconds=time.monotonic() - t1, bytes=offset, tier=tier, file=name)
        stored_key = durable_key if durable_key != plain else ""
        return FileRecord(name=name, size=offset, crc32c=crc, key=stored_key), items

    def _upload_from_local(self, job: SaveJob, files: list[FileRecord], local: Storage, flush: PacedFlush) -> None:
        durable = self.start.durable

        def upload(rec: FileRecord) -> None:
            key = join_key(step_dir(job.step), rec.name)  # the local tier never hashes keys
            t0 = time.monotonic()
            if local.is_posix:
                durable.put_file(record_key(job.step, rec), local.local_path(key), pacer=flush.pacer)
            else:
                durable.put(record_key(job.step, rec), local.get(key), pacer=flush.pacer)
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
        self._durable.close()
        if self._local is not None:
            self._local.close()
        if self._local_writer is not None:
            self._local_writer.close()
        self._pool.shutdown(wait=True)
        for buf in self._maps.values():
            with contextlib.suppress(BufferError):
                buf.close()


class _Slot:
    """The staging slot of one job: given back to the trainer once (``SlotFree``), as soon as nothing reads it."""

    def __init__(self, out: Outbox, job: SaveJob) -> None:
        self.out, self.job, self.freed = out, job, False

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.out.send(SlotFree(self.job.step, self.job.save_id, self.job.slot_id))


def _raise(error: BaseException) -> Callable[[], None]:
    def fail() -> None:
        raise error

    return fail

