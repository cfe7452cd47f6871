"""Restore with two levels: pick the newest restorable step, then read each file from the fastest intact copy —
this node's local dir, a partner node's copy over the network, the durable level — checksums gating each.

Rank 0 picks the candidates (newest durable step, newest committed local-level step) and every rank reports which
of the local step's files its node holds; the local step wins when it is at least as new as the durable one and
every file is held somewhere (or the same save is durable too). A restore at another world size, a local step
with a file held nowhere, or a copy that fails its checksum on every source falls back to the durable level, and
the ``restored`` event and the log say why. A state that does not match the checkpoint is never a reason to fall
back: it raises :class:`~ckptio.errors.StructureMismatchError` naming the key, whatever the level. All collectives
run on the side group, from the training thread.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckptio import format as fmt
from ckptio.engine.partner import check_digest, fetch_verified
from ckptio.engine.partner.digest import finish, new_hasher
from ckptio.engine.protocol import Peer
from ckptio.engine.restore.read_plan import Task
from ckptio.engine.restore.step_restore import RestoreReport, restore_step, unwrap_load_error
from ckptio.engine.restore.storage_reader import CkptioStorageReader
from ckptio.engine.restore.transfer import Source
from ckptio.engine.side_group import SideGroup
from ckptio.errors import (
    CheckpointNotFoundError,
    ChecksumError,
    CkptError,
    CorruptCheckpointError,
    StructureMismatchError,
)
from ckptio.format import Manifest
from ckptio.format.blocks import crc32c
from ckptio.format.local_level import own_copy_key, partner_copy_key
from ckptio.storage.base import Storage

log = logging.getLogger("ckptio")


class LevelsStorageReader(CkptioStorageReader):
    """A local-level step for DCP: per range, this node's own copy → its partner copy → a holder node's copy →
    durable (when allowed).

    Ranges are read as by :class:`CkptioStorageReader` (ranged, block-checked, each read by one rank and sent to
    the others that need it); a file is read only by ranks on nodes that hold a copy when there are any. Per task,
    the sources are tried in order and the first whose bytes pass every block check wins. A partner copy (this
    node's ``partners/`` area, or a file fetched from another node's partner server into it) is used only when it
    hashes to the digest in the level's records on the durable root (``FileRecord.digest``), checked over the whole
    file before any range of it is used; records without one (saved before digests existed) use own copies and the
    durable level only.
    """

    def __init__(self, records: Storage, manifest: Manifest, *, durable: Storage, local: Storage, node: str,
                 held: dict[str, list[str]], peers: tuple[Peer, ...], timeout_s: float,
                 durable_fallback: bool, secret: bytes, **options: Any) -> None:
        # ``.metadata``, the manifest and the rank indexes are the local level's records; data comes from nodes,
        # else from ``durable``.
        super().__init__(records, manifest.step, manifest=manifest, local=local, **options)
        self.durable = durable
        self.node, self.held, self.timeout_s = node, held, timeout_s
        self.digests = {name: rec.digest for name, rec in manifest.files.items() if rec.digest}
        self._secret = secret
        self.peers = peers
        self.durable_fallback = durable_fallback
        self.sources: Counter[str] = Counter()
        """Files this rank used, per source: "local" (its node's disk, or a rank of its node), "partner" (another
        node: its partner server, or a rank there), "durable"."""
        self._files_by_source: dict[str, set[str]] = {}
        self._nodes = {peer.rank: peer.node for peer in peers}
        self._lock = threading.Lock()
        self._file_locks: dict[str, threading.Lock] = {}
        self._partner_ok: dict[str, bool] = {}
        self._fetched: set[str] = set()

    def _readers_of(self, name: str) -> list[int] | None:
        holders = self.held.get(name, [])
        return [peer.rank for peer in self.peers if peer.node in holders] or None

    def _sources(self, name: str) -> list[Source]:
        assert self.local is not None
        local, rec = self.local, self.manifest.files[name]
        own = own_copy_key(self.step, name)
        out = [Source("local", lambda offset, bufs: local.readinto(own, bufs, offset=offset)),
               Source("local", lambda offset, bufs: self._read_partner_copy(name, offset, bufs)),
               Source("partner", lambda offset, bufs: self._read_fetched(name, offset, bufs))]
        if self.durable_fallback:
            durable, key = self.durable, fmt.record_key(self.step, rec)
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
            for peer in self.peers:
                if peer.node != node:
                    continue
                try:  # streamed into place only when its size and digest match the record
                    fetch_verified(peer.host, peer.port, self.step, name, self.local.local_path(key),
                                   expected_digest=self.digests[name], expected_size=rec.size, secret=self._secret,
                                   timeout_s=self.timeout_s)
                    return
                except (OSError, CkptError) as exc:
                    log.warning("ckptio: %s from node %r (%s:%s) unusable: %s", name, node, peer.host, peer.port, exc)
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


@dataclass(frozen=True, slots=True)
class _Decision:
    """Rank 0's choice, broadcast to every rank: the candidates of each level, and why a local one was set aside."""

    durable: int | None
    local: Manifest | None
    durable_fallback: bool = False
    """The local step's save is also committed on the durable level: a file lost on every node is read there."""
    note: str | None = None


def _decide(durable: Storage, records: Storage, step: int | None, world_size: int) -> _Decision | CkptError:
    """Rank 0: the durable candidate, the local candidate (or None) and why a local one was set aside."""
    durable_steps = fmt.committed_steps(durable)
    if step is not None:
        candidate: int | None = step if step in durable_steps else None
        local_steps = [step] if step in fmt.committed_steps(records) else []
        if candidate is None and not local_steps:
            return CheckpointNotFoundError("no committed checkpoint for this step on any level",
                                           root=durable.url, step=step)
    else:
        candidate = durable_steps[-1] if durable_steps else None
        local_steps = [s for s in fmt.committed_steps(records)[-1:] if candidate is None or s >= candidate]
    if not local_steps:
        return _Decision(candidate, None)
    try:
        local = fmt.read_manifest(records, local_steps[-1])
    except (CorruptCheckpointError, CheckpointNotFoundError) as exc:
        return _Decision(candidate, None, note=f"local level unreadable ({exc})")
    if local.world_size != world_size:
        return _Decision(candidate, None, note=f"local-level step {local.step} was saved by {local.world_size} ranks, "
                                                f"this job has {world_size}: restoring from the durable level")
    fallback = False
    if candidate == local.step:
        try:
            fallback = fmt.read_manifest(durable, local.step).save_id == local.save_id
        except (CorruptCheckpointError, CheckpointNotFoundError):
            fallback = False
    return _Decision(candidate, local, durable_fallback=fallback)


class TwoLevelRestore:
    """One ``restore`` of a two-level job (every rank together)."""

    def __init__(self, durable: Storage, records: Storage, *, local: Storage | None, group: SideGroup, node: str,
                 peers: tuple[Peer, ...], secret: bytes, timeout_s: float, concurrency: int,
                 trust_pickles: bool, safe_globals: Sequence[Any]) -> None:
        assert local is not None
        self.durable, self.records, self.local, self.group = durable, records, local, group
        self.node, self.peers, self.secret, self.timeout_s = node, peers, secret, timeout_s
        self.options: dict[str, Any] = {"concurrency": concurrency, "trust_pickles": trust_pickles,
                                        "safe_globals": safe_globals}

    def run(self, state: dict[str, Any], step: int | None) -> RestoreReport:
        """The newest restorable step, from the fastest intact copies."""
        t0 = time.monotonic()
        group = self.group
        decision = group.broadcast_from_rank0(
            _decide(self.durable, self.records, step, group.world_size) if group.rank == 0 else None)
        if isinstance(decision, CkptError):
            raise decision
        local, note = decision.local, decision.note
        if local is not None:
            held = self._held(local)
            missing = [n for n, nodes in held.items() if not nodes]
            if missing and not decision.durable_fallback:
                note = (f"local-level step {local.step}: {len(missing)} file(s) held on no node (e.g. {missing[0]}): "
                        "restoring from the durable level")
            else:
                sources = self._load_local(state, local, held, decision.durable_fallback)
                if sources is not None:
                    return self._report(local.step, "local", dict(sources), note, t0)
                note = (f"local-level step {local.step}: a copy failed its checks on every source: restoring from "
                        "the durable level")
        if decision.durable is None:
            if note is not None:
                raise CheckpointNotFoundError(f"no restorable step: {note}, and the durable level has none",
                                              root=self.durable.url, step=local.step if local else step)
            return self._report(None, "none", {}, None, t0)
        restored = restore_step(self.durable, state, step=decision.durable, local=self.local, group=group,
                                **self.options)
        return self._report(restored, "durable", {}, note, t0)

    def _held(self, local: Manifest) -> dict[str, list[str]]:
        """Every rank reports which files of ``local`` its node holds (right size); all ranks get the union."""
        mine = []
        for name, rec in local.files.items():
            for key in (own_copy_key(local.step, name), partner_copy_key(local.step, name)):
                try:
                    if self.local.head(key).size == rec.size:
                        mine.append(name)
                        break
                except CkptError:
                    continue
        reports = self.group.broadcast_from_rank0(self.group.gather_to_rank0((self.node, mine)))
        held: dict[str, list[str]] = {name: [] for name in local.files}
        for node, names in reports:
            for name in names:
                if node not in held[name]:
                    held[name].append(node)
        return held

    def _load_local(self, state: dict[str, Any], local: Manifest, held: dict[str, list[str]],
                    durable_fallback: bool) -> Counter[str] | None:
        """Load ``local`` into ``state``; None (on every rank) when any rank could not read it. A state that does
        not match raises on every rank: no other copy would match better."""
        group = self.group
        reader = LevelsStorageReader(self.records, local, durable=self.durable, local=self.local, node=self.node,
                                     held=held, peers=self.peers, secret=self.secret, timeout_s=self.timeout_s,
                                     durable_fallback=durable_fallback, **self.options)
        error: CkptError | None = None
        try:
            reader.read_metadata()
        except CkptError as exc:
            error = exc
        if group.any_true(error is not None):
            log.warning("ckptio: local-level step %s: metadata unusable: %s", local.step, error)
            return None
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
                dcp.load(state, storage_reader=reader, process_group=group.group if group.distributed else None)
        except CheckpointException as exc:  # DCP raises a rank's read failure on every rank (a BaseException)
            error = unwrap_load_error(exc, local.step)
        except CkptError as exc:
            error = exc
        except (RuntimeError, KeyError, ValueError, AssertionError) as exc:
            error = StructureMismatchError(f"state does not match the checkpoint: {exc}", step=local.step)
        if group.any_true(isinstance(error, StructureMismatchError)):
            raise error if isinstance(error, StructureMismatchError) else StructureMismatchError(
                "the state of another rank does not match the checkpoint", step=local.step)
        if group.any_true(error is not None):
            log.warning("ckptio: local-level step %s could not be read: %s", local.step, error)
            return None
        return reader.sources

    def _report(self, step: int | None, level: str, sources: dict[str, int], note: str | None,
                t0: float) -> RestoreReport:
        if note:
            log.warning("ckptio: %s", note)
        return RestoreReport(step=step, level=level, sources=sources, note=note, seconds=time.monotonic() - t0)
