"""The writer process of one rank: staging slot → data files → tiers → rank index → (rank 0) commit.

It runs in its own process so serialization, checksums, fsync and HTTP never take the training loop's GIL. It is
fed jobs over a pipe; the snapshot itself stays in the shared-memory slot. Jobs are processed in order. After the
rank index is durable, the job moves to a background thread that waits for the commit: on rank 0 that thread is the
committer (all indexes present → ``.metadata`` → manifest → ``latest`` → retention); on other ranks it watches for
the manifest. Either way the trainer hears ``done`` or ``failed`` per step.

What it sends back (tuples over the pipe): ``("event", record)``, ``("slot_free", step, slot_id)``,
``("done", step, info)``, ``("failed", step, error)``. It must never touch the training process group.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import queue
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex

from ckptio.engine.dcp import build_metadata, item_records
from ckptio.engine.ownership import OwnerRecord, heartbeat
from ckptio.errors import CkptError, CommitError, CorruptCheckpointError, StorageError, StorageFullError
from ckptio.format import (
    FileRecord,
    Manifest,
    RankIndex,
    all_step_dirs,
    apply_retention,
    checksum,
    durable_data_key,
    index_key,
    manifest_key,
    read_failures,
    read_manifest,
    remove_unlisted_files,
    step_dir,
    update_latest,
    versions,
    write_failure,
    write_manifest,
)
from ckptio.format.layout import RankLayout, data_file_name
from ckptio.format.serialize import TensorFramer
from ckptio.storage.base import Storage, join_key


@dataclass(kw_only=True, slots=True)
class WriterSpec:
    """Everything a writer process needs, pickled once at start."""

    rank: int
    world_size: int
    durable: Storage
    local: Storage | None
    keep_last: int
    upload_concurrency: int
    commit_timeout_s: float
    residency: Any = None
    residency_recheck_s: float = 300.0
    owner: OwnerRecord | None = None
    """Rank 0 only: the root's owner record, whose heartbeat this writer keeps fresh."""
    local_capacity_bytes: int | None = None
    """Byte budget of the local tier (None: whatever the filesystem holds)."""
    nice: int = 10
    """CPU niceness added to this process; its I/O goes to the lowest best-effort class when nice > 0."""


@dataclass(kw_only=True, slots=True)
class SaveJob:
    """One save of one rank, as handed from the trainer to its writer."""

    step: int
    save_id: int
    slot_id: int
    slot_path: str
    slot_nbytes: int
    plan_id: int
    """Which plan (sent once with ``("plan", plan_id, PlanInfo)``) this job's slot follows."""
    objects: list[bytes]
    layout: RankLayout | None = None
    """Filled in by the writer from its plan cache."""
    metadata_skeleton: bytes | None = None
    """Filled in by the writer from its plan cache (rank 0 only)."""


@dataclass(kw_only=True, slots=True)
class PlanInfo:
    """A rank's plan, sent once per state structure instead of with every job."""

    layout: RankLayout
    metadata_skeleton: bytes | None
    """Pickled DCP Metadata without storage_data (rank 0 only)."""


class _Outbox:
    """Thread-safe sender to the trainer."""

    def __init__(self, conn: Connection, rank: int) -> None:
        self.conn, self.rank = conn, rank
        self.lock = threading.Lock()

    def send(self, *msg: Any) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (BrokenPipeError, OSError):
                pass  # the trainer is gone; nothing left to tell

    def event(self, event: str, step: int | None = None, **fields: Any) -> None:
        record = {"ts": time.time(), "mono": time.monotonic(), "rank": self.rank, "role": "writer",
                  "event": event, "step": step, **fields}
        self.send("event", record)


def _serialize_tensor(framer: TensorFramer, buf: mmap.mmap, entry: Any) -> list[bytes | memoryview]:
    # frombuffer with offset/count gives a storage covering just this tensor, so torch.save writes only its bytes.
    count = entry.nbytes
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=count, offset=entry.slot_offset) if count else \
        torch.empty(0, dtype=torch.uint8)
    tensor = raw.view(getattr(torch, entry.dtype)).view(entry.shape)
    return framer.frame(tensor, memoryview(buf)[entry.slot_offset : entry.slot_offset + count])


class Writer:
    """The body of the writer process (also usable in-process by tests)."""

    def __init__(self, spec: WriterSpec, outbox: _Outbox) -> None:
        self.spec = spec
        self.out = outbox
        self._maps: dict[str, mmap.mmap] = {}
        self._pool = ThreadPoolExecutor(max_workers=spec.upload_concurrency, thread_name_prefix="ckptio-up")
        self._commits: queue.Queue[tuple[SaveJob, RankIndex] | None] = queue.Queue()
        self._commit_thread = threading.Thread(target=self._commit_loop, name="ckptio-commit", daemon=True)
        self._commit_thread.start()
        self._last_residency_check = 0.0
        self._plans: dict[int, PlanInfo] = {}
        self._framer = TensorFramer()
        self._stop = threading.Event()
        if spec.owner is not None:
            threading.Thread(target=self._heartbeat_loop, name="ckptio-heartbeat", daemon=True).start()

    def _heartbeat_loop(self) -> None:
        assert self.spec.owner is not None
        while not self._stop.wait(self.spec.owner.lease_s / 3):
            heartbeat(self.spec.durable, self.spec.owner)

    def add_plan(self, plan_id: int, plan: PlanInfo) -> None:
        self._plans = {plan_id: plan}  # jobs are in order, so older plans are never referenced again

    # ---- per job ----------------------------------------------------------------------------------------------
    def run_job(self, job: SaveJob) -> None:
        slot_freed = False
        try:
            plan = self._plans[job.plan_id]
            job.layout, job.metadata_skeleton = plan.layout, plan.metadata_skeleton
            self._check_residency()
            buf = self._map(job.slot_path, job.slot_nbytes)
            self._make_local_room(job)
            files, items = self._write_files(job, buf)
            slot_freed = self._free_slot_after_local(job)
            if self.spec.local is not None:
                self._upload_from_local(job, files)
            index = RankIndex(step=job.step, rank=self.spec.rank, world_size=self.spec.world_size,
                              save_id=job.save_id, files=files, items=item_records(items))
            t0 = time.monotonic()
            self.spec.durable.put(index_key(job.step, self.spec.rank), index.to_json())
            self.out.event("phase", job.step, phase="rank_index", seconds=time.monotonic() - t0, bytes=0,
                           tier="durable")
            if not slot_freed:
                self.out.send("slot_free", job.step, job.slot_id)
                slot_freed = True
            self._commits.put((job, index))
        except BaseException as exc:
            if not slot_freed:
                self.out.send("slot_free", job.step, job.slot_id)
            write_failure(self.spec.durable, job.step, f"rank{self.spec.rank}", job.save_id, exc)
            self._fail(job, exc)

    def _make_local_room(self, job: SaveJob) -> None:
        """Keep the local tier within its budget: evict steps that are already durable, else refuse this save."""
        local, budget = self.spec.local, self.spec.local_capacity_bytes
        if local is None or budget is None:
            return
        assert job.layout is not None
        # Serialized files are the raw tensor bytes plus a few KiB of framing per tensor.
        need = job.layout.tensor_bytes + sum(map(len, job.objects)) + 4096 * (len(job.layout.tensors) + 1)
        if need > budget:  # hopeless: keep what the tier holds (a restore may still want it)
            raise StorageFullError(f"local tier budget exhausted: this save needs {need:,} bytes of {budget:,}",
                                   root=local.url, step=job.step, rank=self.spec.rank)
        for step in all_step_dirs(local):
            used = sum(i.size for i in local.list(""))
            if used + need <= budget:
                return
            if step < job.step and self.spec.durable.exists(manifest_key(step)):
                local.delete_prefix(step_dir(step))
        used = sum(i.size for i in local.list(""))
        if used + need > budget:
            raise StorageFullError(
                f"local tier budget exhausted: {used + need:,} bytes needed of {budget:,}",
                root=local.url, step=job.step, rank=self.spec.rank,
            )

    def _free_slot_after_local(self, job: SaveJob) -> bool:
        # With a local tier the snapshot is safe on NVMe/RAM once written: give the slot back before uploading.
        if self.spec.local is not None:
            self.out.send("slot_free", job.step, job.slot_id)
            return True
        return False

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

    def _write_files(self, job: SaveJob, buf: mmap.mmap) -> tuple[list[FileRecord], list[Any]]:
        """Serialize each file and write it to the first tier (local if any, else durable), concurrently."""
        target = self.spec.local or self.spec.durable
        tier = "local" if self.spec.local is not None else "durable"
        assert job.layout is not None
        futures = [self._pool.submit(self._write_one_file, job, buf, n, target, tier)
                   for n in range(job.layout.n_files)]
        files, items = [], []
        for fut in futures:
            rec, its = fut.result()
            files.append(rec)
            items.extend(its)
        return files, items

    def _write_one_file(self, job: SaveJob, buf: mmap.mmap, n: int, target: Storage,
                        tier: str) -> tuple[FileRecord, list[Any]]:
        rank = self.spec.rank
        name = data_file_name(rank, n, job.save_id)
        assert job.layout is not None
        t0 = time.monotonic()
        blobs: list[bytes | memoryview] = []
        items: list[tuple[MetadataIndex, str, int, int]] = []
        offset = 0
        if n == 0:
            for obj, payload in zip(job.layout.objects, job.objects, strict=True):
                blobs.append(payload)
                items.append((obj.index, name, offset, len(payload)))
                offset += len(payload)
        for entry in job.layout.tensors:
            if entry.file_no != n:
                continue
            parts = _serialize_tensor(self._framer, buf, entry)
            length = sum(memoryview(p).nbytes for p in parts)
            blobs.extend(parts)
            items.append((entry.index, name, offset, length))
            offset += length
        crc = checksum(blobs)
        t1 = time.monotonic()
        self.out.event("phase", job.step, phase="serialize", seconds=t1 - t0, bytes=offset, tier=tier, file=name)
        plain = join_key(step_dir(job.step), name)
        durable_key = durable_data_key(self.spec.durable, job.step, name)
        target.put(plain if tier == "local" else durable_key, blobs)
        self.out.event("phase", job.step, phase="local_write" if tier == "local" else "upload",
                       seconds=time.monotonic() - t1, bytes=offset, tier=tier, file=name)
        record_key = durable_key if durable_key != plain else ""
        return FileRecord(name=name, size=offset, crc32c=crc, key=record_key), items

    def _upload_from_local(self, job: SaveJob, files: list[FileRecord]) -> None:
        assert self.spec.local is not None
        local = self.spec.local

        def upload(rec: FileRecord) -> None:
            key = join_key(step_dir(job.step), rec.name)
            target = rec.key or key
            t0 = time.monotonic()
            if local.is_posix:
                self.spec.durable.put_file(target, local.local_path(key))
            else:
                self.spec.durable.put(target, local.get(key))
            self.out.event("phase", job.step, phase="upload", seconds=time.monotonic() - t0, bytes=rec.size,
                           tier="durable", file=rec.name)

        list(self._pool.map(upload, files))

    def _check_residency(self) -> None:
        if self.spec.residency is None:
            return
        now = time.monotonic()
        if now - self._last_residency_check < self.spec.residency_recheck_s and self._last_residency_check:
            return
        from ckptio.policy.residency import check_residency

        check_residency(self.spec.durable, self.spec.residency)
        self._last_residency_check = now

    def _fail(self, job: SaveJob, exc: BaseException) -> None:
        self.out.event("save_failed", job.step, error=str(exc), error_type=type(exc).__name__)
        if not isinstance(exc, CkptError):
            wrapped = StorageError(f"{type(exc).__name__}: {exc}", root=self.spec.durable.url, step=job.step,
                                   rank=self.spec.rank)
            wrapped.__cause__ = None
            exc = wrapped
        self.out.send("failed", job.step, exc)

    # ---- commit -----------------------------------------------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            entry = self._commits.get()
            if entry is None:
                return
            job, index = entry
            try:
                if self.spec.rank == 0:
                    info = self._commit(job, index)
                else:
                    info = self._watch(job)
                self.out.send("done", job.step, info)
            except BaseException as exc:
                if self.spec.rank == 0:
                    write_failure(self.spec.durable, job.step, "commit", job.save_id, exc)
                self._fail(job, exc)
                continue
            # Cleanup is off the commit's critical path: the save is done once the manifest exists.
            self._evict_local(job.step)
            if self.spec.rank == 0:
                self._retain(job.step)

    def _wait_for(self, job: SaveJob, ready: Any) -> Any:
        """Poll ``ready()`` with backoff until it returns non-None, a failure marker appears, or time runs out."""
        deadline = time.monotonic() + self.spec.commit_timeout_s
        delay = 0.01
        while True:
            result = ready()
            if result is not None:
                return result
            failures = read_failures(self.spec.durable, job.step, job.save_id)
            if failures:
                raise CommitError("another rank failed this save: " + "; ".join(failures),
                                  root=self.spec.durable.url, step=job.step, rank=self.spec.rank)
            if time.monotonic() > deadline:
                raise CommitError(f"timed out after {self.spec.commit_timeout_s:.0f} s waiting for the commit",
                                  root=self.spec.durable.url, step=job.step, rank=self.spec.rank)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _gather_indexes(self, job: SaveJob) -> list[RankIndex] | None:
        durable = self.spec.durable
        prefix = join_key(step_dir(job.step), "ranks") + "/"
        keys = [i.key for i in durable.list(prefix)]
        if len(keys) < self.spec.world_size:
            return None
        indexes = [RankIndex.from_json(raw, key=k) for k, raw in durable.get_many(keys).items()]
        current = [ix for ix in indexes if ix.save_id == job.save_id]
        if len({ix.rank for ix in current}) < self.spec.world_size:
            return None  # some ranks still show an index from an older attempt at this step
        return sorted(current, key=lambda ix: ix.rank)

    def _commit(self, job: SaveJob, own: RankIndex) -> dict[str, Any]:
        durable = self.spec.durable
        t0 = time.monotonic()
        indexes = self._wait_for(job, lambda: self._gather_indexes(job))
        if job.metadata_skeleton is None:
            raise CorruptCheckpointError("rank 0 job carries no metadata", step=job.step)
        skeleton = pickle.loads(job.metadata_skeleton)
        metadata = build_metadata(skeleton, indexes, checkpoint_id=join_key(durable.url, step_dir(job.step)))
        t1 = time.monotonic()
        if durable.exists(manifest_key(job.step)):
            # Never touch .metadata of a step someone else committed (a second job racing on this root).
            raise CommitError("step is already committed by another save", root=durable.url, step=job.step)
        raw_metadata = pickle.dumps(metadata)
        durable.put(join_key(step_dir(job.step), ".metadata"), raw_metadata)
        files = {f.name: f for ix in indexes for f in ix.files}
        manifest = Manifest(step=job.step, world_size=self.spec.world_size, save_id=job.save_id, files=files,
                            total_bytes=sum(f.size for f in files.values()), versions=versions(),
                            metadata_crc32c=checksum([raw_metadata]))
        t2 = time.monotonic()
        write_manifest(durable, manifest)
        t3 = time.monotonic()
        self.out.event("phase", job.step, phase="metadata", seconds=t2 - t1, bytes=0, tier="durable",
                       waited_s=t1 - t0)
        self.out.event("phase", job.step, phase="manifest", seconds=t3 - t2, bytes=0, tier="durable")
        update_latest(durable, job.step)
        return {"total_bytes": manifest.total_bytes, "files": len(files)}

    def _retain(self, step: int) -> None:
        """Garbage of earlier attempts and steps beyond keep_last; runs after the trainer heard "done"."""
        durable, t0 = self.spec.durable, time.monotonic()
        try:
            remove_unlisted_files(durable, read_manifest(durable, step))
            removed = apply_retention(durable, keep_last=self.spec.keep_last, newest_committed=step)
        except (StorageError, CorruptCheckpointError) as exc:
            # A failed deletion must not fail the commit; retention is retried at the next one.
            removed = []
            self.out.event("retry", step, op="retention", attempt=1, error=str(exc))
        self.out.event("phase", step, phase="retention", seconds=time.monotonic() - t0, bytes=0,
                       tier="durable", removed=removed)

    def _watch(self, job: SaveJob) -> dict[str, Any]:
        def manifest_ready() -> Manifest | None:
            try:
                raw = self.spec.durable.get(manifest_key(job.step))
            except StorageError:
                return None
            return Manifest.from_json(raw)

        manifest = self._wait_for(job, manifest_ready)
        if manifest.save_id != job.save_id:
            raise CommitError("step was committed by another save", root=self.spec.durable.url,
                              step=job.step, rank=self.spec.rank)
        return {"total_bytes": manifest.total_bytes, "files": len(manifest.files)}

    def _evict_local(self, committed_step: int) -> None:
        """The local tier keeps only the newest committed step of this rank (and anything newer in flight)."""
        local = self.spec.local
        if local is None:
            return
        for step in all_step_dirs(local):
            if step < committed_step:
                try:
                    local.delete_prefix(step_dir(step))
                except StorageError:
                    pass  # best effort: the next commit retries

    def close(self) -> None:
        self._stop.set()
        self._commits.put(None)
        self._commit_thread.join()
        self._pool.shutdown(wait=True)
        for buf in self._maps.values():
            with contextlib.suppress(BufferError):
                buf.close()


def _lower_priority(nice: int) -> None:
    """Let training win the CPU and the disk queue; best-effort (not idle) I/O so a flush is never starved."""
    if nice <= 0:
        return
    os.nice(nice)
    with contextlib.suppress(Exception):  # ionice is Linux-only and may be refused in containers
        import psutil

        psutil.Process().ionice(psutil.IOPRIO_CLASS_BE, value=7)


def writer_main(conn: Connection, spec: WriterSpec) -> None:
    """Process entry point: serve jobs until ``("stop",)`` or the trainer goes away."""
    torch.set_num_threads(1)  # serialization is memcpy-bound; leave the cores to training
    _lower_priority(spec.nice)
    out = _Outbox(conn, spec.rank)
    out.event("writer_started", None, pid=os.getpid())
    writer = Writer(spec, out)
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "stop":
                break
            if msg[0] == "plan":
                writer.add_plan(msg[1], msg[2])
            elif msg[0] == "job":
                writer.run_job(msg[1])
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        writer.close()
        out.send("stopped")
