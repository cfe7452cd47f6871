"""Restore with two levels (issue 10): pick the newest restorable step, then read each file from the fastest intact
copy — this node's local dir, a partner node's copy over the network, the durable level — checksums gating each.

Rank 0 picks the candidates (newest durable step, newest committed local-level step) and every rank reports which
of the local step's files its node holds; the local step wins when it is at least as new as the durable one and
every file is held somewhere (or the same save is durable too). A restore at another world size, a local step
with a file held nowhere, or a copy that fails its checksum on every source falls back to the durable level, and
the ``restored`` event and the log say why. All collectives run on the side group, from the training thread.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckptio import format as fmt
from ckptio.engine.partner import check_digest, fetch_verified
from ckptio.engine.partner.digest import finish, new_hasher
from ckptio.engine.reader import CkptioStorageReader
from ckptio.engine.readplan import Task
from ckptio.engine.restore import restore_step
from ckptio.engine.transfer import Source
from ckptio.errors import CheckpointNotFoundError, ChecksumError, CkptError, CorruptCheckpointError
from ckptio.format.blocks import crc32c
from ckptio.format.local_manifest import (
    LocalManifest,
    LocalRankIndex,
    local_committed_steps,
    local_index_key,
    local_metadata_key,
    own_copy_key,
    partner_copy_key,
    read_local_manifest,
)
from ckptio.format.records import RankIndex
from ckptio.obs.events import Event
from ckptio.storage.base import Storage

if TYPE_CHECKING:
    from ckptio.engine.levels import TwoLevels

log = logging.getLogger("ckptio")


class LevelsStorageReader(CkptioStorageReader):
    """A local-level step for DCP: per range, this node's own copy → its partner copy → a holder node's copy →
    durable (when allowed).

    Ranges are read as by :class:`CkptioStorageReader` (ranged, block-checked, each read by one rank and sent to
    the others that need it); a file is read only by ranks on nodes that hold a copy when there are any. Per task,
    the sources are tried in order and the first whose bytes pass every block check wins. A partner copy (this
    node's ``partners/`` area, or a file fetched from another node's partner server into it) is used only when it
    hashes to the digest in the durable record (``digests``), checked over the whole file before any range of it is
    used; records without one (saved before digests existed) use own copies and the durable level only.
    """

    def __init__(self, storage: Storage, local_manifest: LocalManifest, *, local: Storage, node: str,
                 held: dict[str, list[str]], peers: tuple[tuple[int, str, str, int], ...], timeout_s: float,
                 durable_fallback: bool, secret: bytes, **options: Any) -> None:
        super().__init__(storage, local_manifest.step, manifest=local_manifest.manifest, local=local, **options)
        self.node, self.held, self.timeout_s = node, held, timeout_s
        self.digests, self._secret = local_manifest.digests, secret
        self.peers = peers
        self.durable_fallback = durable_fallback
        self.sources: Counter[str] = Counter()
        """Files this rank used, per source: "local" (its node's disk, or a rank of its node), "partner" (another
        node: its partner server, or a rank there), "durable"."""
        self._files_by_source: dict[str, set[str]] = {}
        self._nodes = {rank: peer_node for rank, peer_node, _, _ in peers}
        self._lock = threading.Lock()
        self._file_locks: dict[str, threading.Lock] = {}
        self._partner_ok: dict[str, bool] = {}
        self._fetched: set[str] = set()

    def metadata_key(self) -> str:
        return local_metadata_key(self.step)

    def _index_key(self, rank: int) -> str:
        return local_index_key(self.step, rank)

    def _parse_index(self, raw: bytes, key: str) -> RankIndex:
        return LocalRankIndex.from_json(raw, key=key).index

    def _readers_of(self, name: str) -> list[int] | None:
        holders = self.held.get(name, [])
        return [rank for rank, peer_node, _, _ in self.peers if peer_node in holders] or None

    def _sources(self, name: str) -> list[Source]:
        assert self.local is not None
        local, rec = self.local, self.manifest.files[name]
        own = own_copy_key(self.step, name)
        out = [Source("local", lambda offset, bufs: local.readinto(own, bufs, offset=offset)),
               Source("local", lambda offset, bufs: self._read_partner_copy(name, offset, bufs)),
               Source("partner", lambda offset, bufs: self._read_fetched(name, offset, bufs))]
        if self.durable_fallback:
            durable, key = self.storage, rec.key or own
            out.append(Source("durable", lambda offset, bufs: durable.readinto(key, bufs, offset=offset)))
        return out

    def _file_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._file_locks.setdefault(name, threading.Lock())

    def _read_partner_copy(self, name: str, offset: int, bufs: list[memoryview]) -> int:
        """A range of the copy this node keeps for another node, once the whole copy matched the records."""
        assert self.local is not None
        key = partner_copy_key(self.step, name)
        with self._file_lock(name):
            if name not in self._partner_ok:
                self._partner_ok[name] = self._partner_copy_intact(key, name)
        if not self._partner_ok[name]:
            raise ChecksumError(f"{name}: this node holds no partner copy that matches its records",
                                root=self.local.url, step=self.step, path=key)
        return self.local.readinto(key, bufs, offset=offset)

    def _partner_copy_intact(self, key: str, name: str) -> bool:
        """Whether the partner copy at ``key`` has the manifest's size and crc32c and the recorded digest (one pass
        in bounded pieces: it crossed the network, so only the digest vouches for it)."""
        assert self.local is not None
        rec, running, done, hasher = self.manifest.files[name], 0, 0, new_hasher()
        piece = memoryview(bytearray(min(self.chunk_bytes, max(rec.size, 1))))
        try:
            while done < rec.size and (got := self.local.readinto(key, piece, offset=done)):
                running, done = crc32c(piece[:got], running), done + got
                hasher.update(piece[:got])
            whole = done == rec.size and self.local.readinto(key, piece[:1], offset=done) == 0
            if not (whole and f"{running:08x}" == rec.crc32c):
                raise ChecksumError(f"{name}: size or crc32c differs from the manifest", step=self.step, path=key)
            check_digest(finish(hasher), self.digests.get(name), what=name, step=self.step, path=key)
        except CkptError as exc:
            if self.local.exists(key):
                log.warning("ckptio: this node's partner copy of %s unusable: %s", name, exc)
            return False
        return True

    def _read_fetched(self, name: str, offset: int, bufs: list[memoryview]) -> int:
        """A range of the file fetched from a holder node into this node's partner area (verified as it came)."""
        assert self.local is not None
        key = partner_copy_key(self.step, name)
        with self._file_lock(name):
            if name not in self._fetched:
                self._fetch_from_nodes(name, key)
                self._fetched.add(name)
        return self.local.readinto(key, bufs, offset=offset)

    def _fetch_from_nodes(self, name: str, key: str) -> None:
        assert self.local is not None
        rec = self.manifest.files[name]
        if name not in self.digests:
            if any(n != self.node for n in self.held.get(name, [])):
                log.warning("ckptio: %s was saved without a partner digest (before digests were recorded): copies "
                            "on other nodes cannot be authenticated and are not used", name)
            raise ChecksumError(f"{name}: no partner digest recorded: copies on other nodes are not used",
                                root=self.storage.url, step=self.step, path=name)
        for node in self.held.get(name, []):
            if node == self.node:
                continue
            for _, peer_node, host, port in self.peers:
                if peer_node != node:
                    continue
                try:  # streamed into place only when its size and digest match the record
                    fetch_verified(host, port, self.step, name, self.local.local_path(key),
                                   expected_digest=self.digests[name], expected_size=rec.size, secret=self._secret,
                                   timeout_s=self.timeout_s)
                    return
                except (OSError, CkptError) as exc:
                    log.warning("ckptio: %s from node %r (%s:%s) unusable: %s", name, node, host, port, exc)
        raise ChecksumError(f"{name}: no intact copy on any other node of the local level", root=self.storage.url,
                            step=self.step, path=name)

    def _count(self, source: str, name: str) -> None:
        files = self._files_by_source.setdefault(source, set())
        if name not in files:
            files.add(name)
            self.sources[source] += 1

    def _on_read(self, task: Task, label: str) -> None:
        super()._on_read(task, label)
        self._count(label, task.file)

    def _on_receive(self, task: Task) -> None:
        super()._on_receive(task)
        self._count("local" if self._nodes.get(task.reader) == self.node else "partner", task.file)


def _decide(storage: Storage, step: int | None, world_size: int) -> dict[str, Any] | CkptError:
    """Rank 0: the durable candidate, the local candidate (or None) and why a local one was set aside."""
    durable_steps = fmt.committed_steps(storage)
    note = None
    try:
        if step is not None:
            durable = step if step in durable_steps else None
            local = read_local_manifest(storage, step)
            if durable is None and local is None:
                return CheckpointNotFoundError("no committed checkpoint for this step on any level",
                                               root=storage.url, step=step)
        else:
            durable = durable_steps[-1] if durable_steps else None
            local_steps = local_committed_steps(storage)
            local = read_local_manifest(storage, local_steps[-1]) if local_steps else None
            if local is not None and durable is not None and local.step < durable:
                local = None
    except CorruptCheckpointError as exc:
        local, note = None, f"local level unreadable ({exc})"
    if local is not None and local.manifest.world_size != world_size:
        note = (f"local-level step {local.step} was saved by {local.manifest.world_size} ranks, this job has "
                f"{world_size}: restoring from the durable level")
        local = None
    fallback = False
    if local is not None and local.durable and durable == local.step:
        fallback = fmt.read_manifest(storage, durable).save_id == local.manifest.save_id
    return {"durable": durable, "local": local, "durable_fallback": fallback, "note": note}


def _held(ck: TwoLevels, local: LocalManifest) -> dict[str, list[str]]:
    """Every rank reports which files of ``local`` its node holds (right size); all ranks get the union."""
    assert ck.local is not None and ck._levels is not None
    mine = []
    for name, rec in local.manifest.files.items():
        for key in (own_copy_key(local.step, name), partner_copy_key(local.step, name)):
            try:
                if ck.local.head(key).size == rec.size:
                    mine.append(name)
                    break
            except CkptError:
                continue
    reports = ck.group.broadcast_from_rank0(ck.group.gather_to_rank0((ck._levels.start.node, mine)))
    held: dict[str, list[str]] = {name: [] for name in local.manifest.files}
    for node, names in reports:
        for name in names:
            if node not in held[name]:
                held[name].append(node)
    return held


def _load_local(ck: TwoLevels, state: dict[str, Any], local: LocalManifest, held: dict[str, list[str]],
                durable_fallback: bool) -> Counter[str] | None:
    """Load ``local`` into ``state``; None (on every rank) when any rank could not."""
    assert ck.local is not None and ck._levels is not None
    config = ck.config
    reader = LevelsStorageReader(ck.storage, local, local=ck.local, node=ck._levels.start.node, held=held,
                                 peers=ck._levels.start.peers, timeout_s=config.partner_timeout_s,
                                 durable_fallback=durable_fallback, secret=ck._levels.start.secret,
                                 concurrency=config.upload_concurrency,
                                 trust_pickles=config.trust_pickles, safe_globals=config.safe_globals)
    error: BaseException | None = None
    try:
        reader.read_metadata()
    except CkptError as exc:
        error = exc
    if ck.group.any_true(error is not None):
        log.warning("ckptio: local-level step %s: metadata unusable: %s", local.step, error)
        return None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(state, storage_reader=reader, process_group=ck.group.group if ck.group.distributed else None)
    except (Exception, CheckpointException) as exc:  # DCP raises a rank's read failure on every rank (a BaseException)
        error = exc
    if ck.group.any_true(error is not None):
        log.warning("ckptio: local-level step %s could not be read: %s", local.step, error)
        return None
    return reader.sources


def restore_from_levels(ck: TwoLevels, state: dict[str, Any], step: int | None) -> int | None:
    """``Checkpointer.restore`` with two levels: the newest restorable step, from the fastest intact copies."""
    t0 = time.monotonic()
    decision = ck.group.broadcast_from_rank0(_decide(ck.storage, step, ck.world_size) if ck.rank == 0 else None)
    if isinstance(decision, CkptError):
        raise decision
    local: LocalManifest | None = decision["local"]
    note: str | None = decision["note"]
    if local is not None:
        held = _held(ck, local)
        missing = [n for n, nodes in held.items() if not nodes]
        if missing and not decision["durable_fallback"]:
            note = (f"local-level step {local.step}: {len(missing)} file(s) held on no node (e.g. {missing[0]}): "
                    "restoring from the durable level")
        else:
            sources = _load_local(ck, state, local, held, decision["durable_fallback"])
            if sources is not None:
                _report(ck, local.step, "local", dict(sources), note, t0=t0)
                return local.step
            note = f"local-level step {local.step}: a copy failed its checks on every source: restoring from durable"
    durable = decision["durable"]
    if durable is None:
        if note is not None:
            raise CheckpointNotFoundError(f"no restorable step: {note}, and the durable level has none",
                                          root=ck.storage.url, step=local.step if local else step)
        _report(ck, None, "none", {}, None, t0=t0)
        return None
    restored = restore_step(ck.storage, state, step=durable, local=ck.local, group=ck.group,
                            concurrency=ck.config.upload_concurrency, trust_pickles=ck.config.trust_pickles,
                            safe_globals=ck.config.safe_globals)
    _report(ck, restored, "durable", {}, note, t0=t0)
    return restored


def _report(ck: TwoLevels, step: int | None, level: str, sources: dict[str, int], note: str | None, *,
            t0: float) -> None:
    if note:
        log.warning("ckptio: %s", note)
    ck.last_restore = {"step": step, "level": level, "sources": sources, "note": note}
    ck.events.emit(Event.RESTORED, step, level=level, sources=sources, note=note, seconds=time.monotonic() - t0)
