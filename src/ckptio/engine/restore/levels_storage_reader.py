"""The DCP StorageReader of a local-level step: each range from the fastest intact copy of its file — this node's
own copy, the partner copy it keeps, a holder node's copy fetched over its partner server — and the durable root
when the same save is durable too. Checksums gate every source; partner copies are authenticated by the digest the
level's records hold before any range of them is used.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable

from ckptio import format as fmt
from ckptio.engine.partner import check_digest, fetch_verified
from ckptio.engine.partner.digest import finish, new_hasher
from ckptio.engine.restore.context import RestoreContext
from ckptio.engine.restore.early_push import Landed
from ckptio.engine.restore.read_plan import Task
from ckptio.engine.restore.step_layout import check_real_sizes
from ckptio.engine.restore.storage_reader import CkptioStorageReader, ReadTally
from ckptio.engine.restore.transfer import Source
from ckptio.errors import ChecksumError, CkptError, ConfigError
from ckptio.format import Manifest
from ckptio.format.blocks import crc32c
from ckptio.format.local_level_records import own_copy_key, partner_copy_key
from ckptio.storage.base import Storage

log = logging.getLogger("ckptio")

Landing = Callable[[Callable[[Landed], bool]], bool]
"""A pushed file's ``land(check)`` (:meth:`~ckptio.engine.restore.early_push.EarlyPush.landings`)."""


class LevelsTally(ReadTally):
    """Besides the bytes: the files this rank used, per source — "local" (its node's disk, or a rank of its node),
    "partner" (another node: its partner server, or a rank there), "durable"."""

    def __init__(self, nodes: dict[int, str], node: str) -> None:
        super().__init__()
        self.sources: Counter[str] = Counter()
        self._nodes, self._node = nodes, node
        self._files_by_source: dict[str, set[str]] = {}

    def _count(self, source: str, name: str) -> None:
        files = self._files_by_source.setdefault(source, set())
        if name not in files:
            files.add(name)
            self.sources[source] += 1

    def read(self, task: Task, label: str) -> None:
        super().read(task, label)
        self._count(label, task.file)

    def received(self, task: Task) -> None:
        super().received(task)
        self._count("local" if self._nodes.get(task.reader) == self._node else "partner", task.file)


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

    def __init__(self, ctx: RestoreContext, manifest: Manifest, *, held: dict[str, list[str]],
                 durable_fallback: bool) -> None:
        """``held[file]``: the nodes holding a copy of ``file``; ``durable_fallback``: the same save is committed on
        the durable level, which may serve a range no node's copy does."""
        assert ctx.level is not None and ctx.local is not None
        level = self.level = ctx.level
        # ``.metadata``, the manifest and the rank indexes are the local level's records; data comes from nodes,
        # else from the durable root.
        self.local_dir: Storage = ctx.local
        directory = ctx.local.local_directory()
        if directory is None:
            raise ConfigError("the local level's restore needs a POSIX local_dir (partner copies are fetched into it)")
        self._local_file = directory.local_path
        self._open(level.records, manifest, step=manifest.step, local=ctx.local, process_group=ctx.process_group,
                   options=ctx.options)
        self.durable = ctx.durable
        self.held = held
        self.digests = {name: rec.digest for name, rec in manifest.files.items() if rec.digest}
        self.durable_fallback = durable_fallback
        self._lock = threading.Lock()
        self._file_locks: dict[str, threading.Lock] = {}
        self._partner_ok: dict[str, bool] = {}
        self._fetched: set[str] = set()
        self._pushed_to: dict[str, int] = {}
        self._landings: dict[str, Landing] = {}

    def given_pushes(self, pushed_to: dict[str, int], landings: dict[str, Landing]) -> None:
        """Files pushed to a node's partner area (:mod:`~ckptio.engine.restore.early_push`): ``pushed_to`` name →
        the rank each goes to (on every rank), ``landings`` name → wait for it to land (this rank's). Only that rank
        knows when its copy is whole, so only it reads the copy on its node (others there receive from it). It
        holds the copy to the manifest's size and crc32c and the recorded digest, hashed as the pieces landed (no
        second read), and counts it as come from another node."""
        self._pushed_to, self._landings = dict(pushed_to), dict(landings)

    def _new_tally(self) -> LevelsTally:
        return LevelsTally({peer.rank: peer.node for peer in self.level.peers}, self.level.node)

    @property
    def sources(self) -> Counter[str]:
        """Files this rank used in the last read, per source (:class:`LevelsTally`)."""
        assert isinstance(self.tally, LevelsTally)
        return self.tally.sources

    def _readers_of(self, name: str) -> list[int] | None:
        holders, receiver = self.held.get(name, []), self._pushed_to.get(name)
        ranks = [peer.rank for peer in self.level.peers if peer.node in holders]
        if receiver is not None:  # of the pushed-to node, only the rank that put the copy there
            node_of = {peer.rank: peer.node for peer in self.level.peers}
            ranks = [r for r in ranks if r == receiver or node_of.get(r) != node_of.get(receiver)]
        return ranks or None

    def _check_claims(self, names: set[str]) -> None:
        """A copy a node holds was sized against the manifest when its node reported it (``held``); a file no node
        holds is read from the durable root, whose copy is held to the manifest here."""
        check_real_sizes(self.durable, self.manifest, {name for name in names if not self.held.get(name)})

    def _sources(self, name: str) -> list[Source]:
        local, rec = self.local_dir, self.manifest.files[name]
        own = own_copy_key(self.step, name)
        kept = "partner" if name in self._landings else "local"  # a pushed copy came over the network
        out = [Source("local", lambda offset, bufs: local.readinto(own, bufs, offset=offset)),
               Source(kept, lambda offset, bufs: self._read_partner_copy(name, offset, bufs)),
               Source("partner", lambda offset, bufs: self._read_fetched(name, offset, bufs))]
        if self.durable_fallback:
            durable, key = self.durable, fmt.record_key(self.step, rec)
            out.append(Source("durable", lambda offset, bufs: durable.readinto(key, bufs, offset=offset)))
        return out

    def _file_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._file_locks.setdefault(name, threading.Lock())

    def check_partner_copies(self, names: set[str]) -> threading.Thread | None:
        """Start checking this node's partner copies of ``names`` in the background (those no node holds its own
        copy of: this node will read them for the others). The check reads and hashes the whole file, cold after a
        node loss; begun here it overlaps the readiness gate and DCP's planning instead of delaying the first read,
        which waits on the file's lock for its outcome. Join the thread before the reader goes."""
        mine = sorted(name for name in names if name in self._landings or (
            name not in self._pushed_to and self.local_dir.exists(partner_copy_key(self.step, name))))
        if not mine:
            return None
        thread = threading.Thread(target=lambda: [self._partner_copy_ok(name) for name in mine],
                                  name="ckptio-partner-check", daemon=True)
        thread.start()
        return thread

    def _partner_copy_ok(self, name: str) -> bool:
        with self._file_lock(name):
            if name not in self._partner_ok:
                landing = self._landings.get(name)
                self._partner_ok[name] = (landing(functools.partial(self._pushed_copy_intact, name))
                                          if landing is not None
                                          else self._partner_copy_intact(partner_copy_key(self.step, name), name))
            return self._partner_ok[name]

    def _read_partner_copy(self, name: str, offset: int, bufs: list[memoryview]) -> int:
        """A range of the copy this node keeps for another node, once the whole copy matched the records."""
        key = partner_copy_key(self.step, name)
        if not self._partner_copy_ok(name):
            raise ChecksumError(f"{name}: this node holds no partner copy that matches its records",
                                root=self.local_dir.url, step=self.step, path=key)
        return self.local_dir.readinto(key, bufs, offset=offset)

    def _partner_copy_intact(self, key: str, name: str) -> bool:
        """Whether the partner copy at ``key`` has the manifest's size and crc32c and the recorded digest (one pass
        in bounded pieces: it crossed the network, so only the digest vouches for it)."""
        rec, running, done, hasher = self.manifest.files[name], 0, 0, new_hasher()
        piece = memoryview(bytearray(min(self.options.chunk_bytes, max(rec.size, 1))))
        try:
            while done < rec.size and (got := self.local_dir.readinto(key, piece, offset=done)):
                running, done = crc32c(piece[:got], running), done + got
                hasher.update(piece[:got])
            whole = done == rec.size and self.local_dir.readinto(key, piece[:1], offset=done) == 0
            if not (whole and f"{running:08x}" == rec.crc32c):
                raise ChecksumError(f"{name}: size or crc32c differs from the manifest", step=self.step, path=key)
            check_digest(finish(hasher), self.digests.get(name), what=name, step=self.step, path=key)
        except CkptError as exc:
            if self.local_dir.exists(key):
                log.warning("ckptio: this node's partner copy of %s unusable: %s", name, exc)
            return False
        return True

    def _pushed_copy_intact(self, name: str, landed: Landed) -> bool:
        """Whether a copy pushed to this rank arrived with the manifest's size and crc32c and the recorded digest."""
        rec = self.manifest.files[name]
        try:
            if (landed.size, landed.crc32c) != (rec.size, rec.crc32c):
                raise ChecksumError(f"{name}: size or crc32c differs from the manifest", step=self.step, path=name)
            check_digest(landed.digest, self.digests.get(name), what=name, step=self.step, path=name)
        except CkptError as exc:
            log.warning("ckptio: the copy of %s pushed to this node unusable: %s", name, exc)
            return False
        return True

    def _read_fetched(self, name: str, offset: int, bufs: list[memoryview]) -> int:
        """A range of the file fetched from a holder node into this node's partner area (verified as it came)."""
        key = partner_copy_key(self.step, name)
        with self._file_lock(name):
            if name not in self._fetched:
                self._fetch_from_nodes(name, key)
                self._fetched.add(name)
        return self.local_dir.readinto(key, bufs, offset=offset)

    def _fetch_from_nodes(self, name: str, key: str) -> None:
        rec = self.manifest.files[name]
        if name not in self.digests:
            if any(n != self.level.node for n in self.held.get(name, [])):
                log.warning("ckptio: %s was saved without a partner digest (before digests were recorded): copies "
                            "on other nodes cannot be authenticated and are not used", name)
            raise ChecksumError(f"{name}: no partner digest recorded: copies on other nodes are not used",
                                root=self.storage.url, step=self.step, path=name)
        for node in self.held.get(name, []):
            if node == self.level.node:
                continue
            for peer in self.level.peers:
                if peer.node != node:
                    continue
                try:  # streamed into place only when its size and digest match the record
                    fetch_verified(peer.host, peer.port, self.step, name, self._local_file(key),
                                   expected_digest=self.digests[name], expected_size=rec.size, secret=self.level.secret,
                                   timeout_s=self.level.timeout_s)
                    return
                except (OSError, CkptError) as exc:
                    log.warning("ckptio: %s from node %r (%s:%s) unusable: %s", name, node, peer.host, peer.port, exc)
        raise ChecksumError(f"{name}: no intact copy on any other node of the local level", root=self.storage.url,
                            step=self.step, path=name)
