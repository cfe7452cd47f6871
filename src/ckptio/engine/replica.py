"""The local level in the writer process (issue 10): copies to partner nodes, the local rank index, the local
commit (rank 0) or watch (other ranks), and eviction of older local-level steps.

Per local-level :class:`~ckptio.engine.protocol.SaveJob`, after the job pipeline wrote this rank's files to its
node's ``local_dir``: send each file to the ``replicas`` partner ranks' servers (they check the crc32c before they
acknowledge), write this rank's :class:`~ckptio.format.local_manifest.LocalRankIndex` (small, to the durable root),
and queue the commit. A partner that does not acknowledge fails this save's local level only: a failure marker
tells rank 0's committer at once, the trainer hears ``SaveFailed`` (a local-only save) or a ``level_failed`` event
(a save that also goes durable, whose durable commit is unaffected), and training goes on.

It never touches a process group, never reads a staging slot (the files are on the local dir by then), and never
writes or deletes anything of the durable level's steps.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ckptio.engine.committer import report_failure
from ckptio.engine.ownership import ensure_lease
from ckptio.engine.partner import PartnerLimits, PartnerServer, file_digest, send_files
from ckptio.engine.protocol import CommitInfo, LevelsStart, Outbox, SaveDone, SaveJob, WriterStart
from ckptio.errors import CommitError, CorruptCheckpointError, StorageError
from ckptio.format import FileRecord, ItemRecord, Manifest, RankIndex, checksum, read_failures, step_dir, versions
from ckptio.format.commit import all_step_dirs
from ckptio.format.keys import parse_step_dir
from ckptio.format.local_manifest import (
    PARTNERS_DIR,
    LocalManifest,
    LocalRankIndex,
    delete_local_step,
    local_committed_steps,
    local_failed_key,
    local_index_key,
    local_metadata_key,
    local_step_dirs,
    local_step_key,
    own_copy_key,
    read_local_manifest,
    write_local_manifest,
)
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import join_key

T = TypeVar("T")


class _Superseded:
    """A watched local step that rank 0 committed and has since evicted for a newer one."""


_SUPERSEDED = _Superseded()


class LocalLevel:
    """One writer's part of the local level: partner server, replication, local commits, eviction."""

    def __init__(self, start: WriterStart, out: Outbox) -> None:
        assert start.levels is not None and start.local is not None
        self.start, self.out, self.levels = start, out, start.levels
        self.local, self.durable = start.local, start.durable
        self.peers = {r: (node, host, port) for r, node, host, port in self.levels.peers}
        self.server = PartnerServer(socket.socket(fileno=self.levels.listen_fd), self.local,
                                    secret=self.levels.secret, limits=PartnerLimits.for_timeout(self.levels.timeout_s))
        self._requests: queue.Queue[tuple[SaveJob, bytes | None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="ckptio-local-commit", daemon=True)
        self._thread.start()

    # ---- job pipeline (the writer's job thread) ---------------------------------------------------------------
    def run(self, job: SaveJob, metadata_skeleton: bytes | None, files: list[FileRecord],
            items: list[ItemRecord]) -> None:
        """Replicate, write the local rank index, queue the commit. Never raises: a failure is this level's."""
        try:
            holders, digests = self._replicate(job, files)
            index = RankIndex(step=job.step, rank=self.start.rank, world_size=self.start.world_size,
                              save_id=job.save_id, files=files, items=items)
            entry = LocalRankIndex(index=index, node=self.levels.node, holders=holders, digests=digests)
            self.durable.put(local_index_key(job.step, self.start.rank), entry.to_json())
        except BaseException as exc:
            self._mark_failed(job, f"rank{self.start.rank}", exc)
            self._failed(job, exc)
            return
        self._requests.put((job, metadata_skeleton))

    def _replicate(self, job: SaveJob, files: list[FileRecord]) -> tuple[list[str], dict[str, str]]:
        """Copy to each partner; returns the holders and each file's digest (hashed while sent to the first
        partner; without partners, from disk: a restore on another node may still fetch these files)."""
        holders = [self.levels.node]
        sendable = [(rec.name, self.local.local_path(own_copy_key(job.step, rec.name)), rec.size, rec.crc32c)
                    for rec in files]
        t0 = time.monotonic()
        digests: dict[str, str] | None = None
        for partner in self.levels.partner_ranks:
            node, host, port = self.peers[partner]
            digests = send_files(host, port, job.step, sendable, secret=self.levels.secret, digests=digests,
                                 timeout_s=self.levels.timeout_s, who=f"rank {partner} on node {node!r}")
            holders.append(node)
        if digests is None:
            digests = {name: file_digest(path) for name, path, _, _ in sendable}
        self.out.event(Event.PHASE, job.step, phase=Phase.REPLICATE, seconds=time.monotonic() - t0,
                       bytes=sum(f.size for f in files) * len(self.levels.partner_ranks), tier="partner",
                       partners=list(self.levels.partner_ranks))
        return holders, digests

    def _mark_failed(self, job: SaveJob, who: str, exc: BaseException) -> None:
        body = {"save_id": job.save_id, "error": f"{type(exc).__name__}: {exc}", "time": time.time()}
        with contextlib.suppress(StorageError):  # the committer's timeout is the fallback
            self.durable.put(local_failed_key(job.step, who), json.dumps(body).encode())

    def _failed(self, job: SaveJob, exc: BaseException) -> None:
        self.out.event(Event.LEVEL_FAILED, job.step, level="local", error=str(exc), error_type=type(exc).__name__)
        if not job.durable:  # a local-only save: its handle hears why; a durable one is decided by its own commit
            report_failure(self.out, self.start, job.step, job.save_id, exc)

    # ---- commit thread ---------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while (request := self._requests.get()) is not None:
            job, skeleton = request
            try:
                manifest = self._commit(job, skeleton) if self.start.rank == 0 else self._watch(job)
            except BaseException as exc:
                if self.start.rank == 0:
                    self._mark_failed(job, "commit", exc)
                self._failed(job, exc)
                continue
            holders = sorted({n for hs in manifest.holders.values() for n in hs}) if manifest is not None else []
            self.out.event(Event.LEVEL_COMMITTED, job.step, level="local", durable_too=job.durable, holders=holders)
            if not job.durable:
                info = (CommitInfo(total_bytes=manifest.manifest.total_bytes, files=len(manifest.manifest.files))
                        if manifest is not None else CommitInfo(total_bytes=0, files=0))
                self.out.send(SaveDone(job.step, job.save_id, info))
            self._evict(job.step)

    def _wait_for(self, job: SaveJob, ready: Callable[[], T | None]) -> T:
        timeout_s = self.start.config.commit_timeout_s
        deadline, delay = time.monotonic() + timeout_s, 0.01
        while (result := ready()) is None:
            failures = self._failures(job)
            if failures:
                raise CommitError("local level: a rank failed this save: " + "; ".join(failures),
                                  root=self.durable.url, step=job.step, rank=self.start.rank)
            if time.monotonic() > deadline:
                raise CommitError(f"local level: timed out after {timeout_s:.0f} s waiting for the commit",
                                  root=self.durable.url, step=job.step, rank=self.start.rank)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        return result

    def _failures(self, job: SaveJob) -> list[str]:
        out = read_failures(self.durable, job.step, job.save_id)  # the job pipeline's own markers
        for info in self.durable.list(local_step_key(job.step, "failed") + "/"):
            try:
                body = json.loads(self.durable.get(info.key))
            except (StorageError, ValueError):
                continue
            if body.get("save_id") == job.save_id:
                out.append(f"{info.key.rsplit('/', 1)[-1].removesuffix('.json')}: {body.get('error')}")
        return out

    def _gather(self, job: SaveJob) -> list[LocalRankIndex] | None:
        keys = [i.key for i in self.durable.list(local_step_key(job.step, "ranks") + "/")]
        if len(keys) < self.start.world_size:
            return None
        entries = [LocalRankIndex.from_json(raw, key=k) for k, raw in self.durable.get_many(keys).items()]
        current = [e for e in entries if e.index.save_id == job.save_id]
        if len({e.index.rank for e in current}) < self.start.world_size:
            return None
        return sorted(current, key=lambda e: e.index.rank)

    def _commit(self, job: SaveJob, skeleton: bytes | None) -> LocalManifest:
        entries = self._wait_for(job, lambda: self._gather(job))
        if skeleton is None:
            raise CorruptCheckpointError("rank 0 job carries no metadata", step=job.step)
        from ckptio.engine.dcp import build_metadata  # rank 0's writer only: unpickling the skeleton loads torch

        metadata = build_metadata(pickle.loads(skeleton), [e.index for e in entries],
                                  checkpoint_id=join_key(self.durable.url, local_step_key(job.step)))
        raw = pickle.dumps(metadata)
        ensure_lease(self.durable, self.start.owner)
        self.durable.put(local_metadata_key(job.step), raw)
        files = {f.name: f for e in entries for f in e.index.files}
        manifest = Manifest(step=job.step, world_size=self.start.world_size, save_id=job.save_id, files=files,
                            total_bytes=sum(f.size for f in files.values()), versions=versions(),
                            metadata_crc32c=checksum([raw]))
        local_manifest = LocalManifest(manifest=manifest, holders={f.name: e.holders for e in entries
                                                                   for f in e.index.files},
                                       nodes={e.index.rank: e.node for e in entries}, durable=job.durable,
                                       digests={n: d for e in entries for n, d in e.digests.items()})
        write_local_manifest(self.durable, local_manifest)
        return local_manifest

    def _watch(self, job: SaveJob) -> LocalManifest | None:
        """Rank 0's local manifest of this save; None when it committed and was already evicted for a newer local
        step (rank 0 keeps only the newest, and this watcher may lag several saves behind it)."""
        def ready() -> LocalManifest | _Superseded | None:
            try:
                found = read_local_manifest(self.durable, job.step)
                if found is None and any(s > job.step for s in local_committed_steps(self.durable)):
                    # Committed in order on rank 0, failures leave markers (checked by _wait_for first).
                    return _SUPERSEDED if not self._failures(job) else None
                return found
            except StorageError:
                return None

        manifest = self._wait_for(job, ready)
        if manifest is _SUPERSEDED:
            return None
        assert isinstance(manifest, LocalManifest)
        if manifest.manifest.save_id != job.save_id:
            raise CommitError("local level: step was committed by another save", root=self.durable.url,
                              step=job.step, rank=self.start.rank)
        return manifest

    def _evict(self, committed: int) -> None:
        """Keep only the newest committed local-level step (and anything newer in flight): own files, partner
        copies, and (rank 0) the records on the durable root. Best effort: the next commit retries."""
        with contextlib.suppress(StorageError):
            for step in all_step_dirs(self.local):
                if step < committed:
                    self.local.delete_prefix(step_dir(step))
            for step in (s for s in map(parse_step_dir, self.local.list_dirs(PARTNERS_DIR)) if s is not None):
                if step < committed:
                    self.local.delete_prefix(join_key(PARTNERS_DIR, step_dir(step)))
            if self.start.rank == 0:
                newest = local_committed_steps(self.durable)
                for step in local_step_dirs(self.durable):
                    if step < committed and newest and step < newest[-1]:
                        delete_local_step(self.durable, step)

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join()
        committed: list[int] | None = None
        with contextlib.suppress(StorageError):  # unknown: keep every received copy (eviction removes it later)
            committed = local_committed_steps(self.durable)
        self.server.close(keep_steps=committed)


__all__ = ["LevelsStart", "LocalLevel"]
