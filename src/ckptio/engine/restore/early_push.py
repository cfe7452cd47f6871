"""A lost node's files pushed back to it by the nodes that hold their partner copies, while rank 0 still chooses.

After a node is lost, its ranks' files of the newest local-level step survive only as partner copies on other
nodes, and their bytes must cross the replaced node's link: that transfer is the restore's floor. Left to DCP's
read, it begins only after rank 0's choice (round trips to a store that the whole restarting job is loading from),
the readiness gate and DCP's planning. Here every node first reports what its local dir holds (one gather, local
disks only, no store), and every rank derives the same plan from the reports: each file of the newest step with
partner copies, that no node holds as its own and that its writer's node does not hold at all, is sent from the
first node holding a partner copy to the rank that wrote it. The sends and receives are posted before the choice,
so the bytes cross while rank 0 looks up the store and while DCP plans. The same reports tell the restore which
node holds which file (:meth:`EarlyPush.held`), so the holdings need no gather of their own.

Rules:

* A head start, never a source of truth: a pushed file lands in the receiver's partner area and is used only as any
  partner copy is, after the whole file hashed to the digest the level's records hold
  (:class:`~ckptio.engine.restore.levels_storage_reader.LevelsStorageReader`). A push that fails leaves the restore
  to fetch or read as it would have; a choice of another step leaves the pushed bytes unused.
* Bounded: at most ``concurrency × chunk_bytes`` (:class:`~ckptio.engine.restore.context.ReadOptions`) is pushed to
  or from one rank, whole files in plan order; a lost node's other files come through DCP's read as before.
* Posted from the training thread on a gloo group made for them and destroyed after: on the side group's own
  connections, the restore's collectives (the choice's broadcast, the readiness gate) queued behind the pushed bytes.
  A landing may be waited on from the restore's partner-check thread (waiting is not a collective);
  :meth:`EarlyPush.finish` waits every posted send and receive before the restore returns, whatever it chose.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ckptio.engine.partner.digest import finish, new_hasher
from ckptio.engine.restore.context import RestoreContext
from ckptio.engine.side_group import moves_cpu_tensors, recv_async, send_async
from ckptio.errors import CkptError
from ckptio.format import Manifest
from ckptio.format.blocks import crc32c
from ckptio.format.keys import parse_step_dir
from ckptio.format.local_level_records import PARTNERS_DIR, partner_copy_key
from ckptio.storage.base import Storage, join_key

log = logging.getLogger("ckptio")

PUSH_TAG_BASE = 1 << 30
"""Tags of the pushes start here (gloo's are 32-bit ints); the read's exchange tags its ranges with task ids."""

PUSH_PIECE_BYTES = 4 << 20
"""A push crosses in pieces of this size: the receiver hashes one while the next crosses."""

_WRITER_RANK = re.compile(r"^__(\d+)_\d+")

Holding = tuple[str, bool, int]
"""One copy a node holds: (file name, own copy or not, size)."""


@dataclass(frozen=True, slots=True)
class Held:
    """Where a local step's files are: the nodes holding a copy of each, and the files some node holds as its own
    copy (the others survive only as partner copies: a node was lost)."""

    nodes: dict[str, list[str]]
    owned: set[str]


@dataclass(frozen=True, slots=True)
class Push:
    """One file of ``step`` sent whole from ``sender`` to ``receiver`` (side-group ranks), in pieces tagged from
    ``tag`` up."""

    step: int
    name: str
    size: int
    sender: int
    receiver: int
    tag: int

    def pieces(self) -> list[tuple[int, int]]:
        """(offset, length) of each piece, in order: the receiver hashes each while the next one crosses."""
        return [(offset, min(PUSH_PIECE_BYTES, self.size - offset)) for offset in range(0, self.size,
                                                                                         PUSH_PIECE_BYTES)]


@dataclass(frozen=True, slots=True)
class Landed:
    """A pushed file as it arrived: its size, crc32c (hex) and digest, computed piece by piece."""

    size: int
    crc32c: str
    digest: str


def node_holdings(local: Storage) -> dict[int, list[Holding]]:
    """What this node's local dir holds, per step: its own copies and the partner copies it keeps (sizes as found).
    Unreadable parts are left out: a head start must not fail a restore."""
    found: dict[int, list[Holding]] = {}
    for own, prefix in ((True, ""), (False, PARTNERS_DIR)):
        try:
            steps = [(s, d) for d in local.list_dirs(prefix) if (s := parse_step_dir(d)) is not None]
            for step, directory in steps:
                for info in local.list(join_key(prefix, directory) + "/"):
                    name = info.key.rsplit("/", 1)[-1]
                    if not name.startswith("."):  # a temporary file of a copy still arriving
                        found.setdefault(step, []).append((name, own, info.size))
        except CkptError as exc:
            log.warning("ckptio: this node's local dir could not be listed for the restore: %s", exc)
    return found


def plan_pushes(reports: dict[str, dict[int, list[Holding]]], node_of: list[str], *, cap_bytes: int) -> list[Push]:
    """The pushes every rank derives alike from the nodes' ``reports``; ``node_of[rank]``: each side-group rank's
    node (module docstring: which files, from where, to whom)."""
    partner_steps = [step for held in reports.values() for step, copies in held.items()
                     if any(not own for _, own, _ in copies)]
    if not partner_steps:
        return []
    step = max(partner_steps)
    partner_holders: dict[str, list[tuple[str, int]]] = {}
    owned: set[str] = set()
    for node in sorted(reports):
        for name, own, size in reports[node].get(step, []):
            if own:
                owned.add(name)
            else:
                partner_holders.setdefault(name, []).append((node, size))
    first_rank = {node: node_of.index(node) for node in set(node_of)}
    pushes: list[Push] = []
    sent_to, sent_from = [0] * len(node_of), [0] * len(node_of)
    for name in sorted(set(partner_holders) - owned):
        copies, match = partner_holders[name], _WRITER_RANK.match(name)
        if match is None or int(match.group(1)) >= len(node_of) or copies[0][1] <= 0:
            continue  # not a data file of ckptio's, written by a rank this job does not have, or empty
        receiver = int(match.group(1))
        if any(node == node_of[receiver] for node, _ in copies):
            continue  # its node keeps a copy: the restore reads it there
        node, size = copies[0]
        sender = first_rank.get(node)
        if sender is None or sent_to[receiver] + size > cap_bytes or sent_from[sender] + size > cap_bytes:
            continue
        sent_to[receiver] += size
        sent_from[sender] += size
        tag = pushes[-1].tag + len(pushes[-1].pieces()) if pushes else PUSH_TAG_BASE
        pushes.append(Push(step, name, size, sender, receiver, tag))
    return pushes


class EarlyPush:
    """This rank's side of the pushes of one restore (:meth:`begin` on every rank together)."""

    def __init__(self, ctx: RestoreContext, node_of: list[str], reports: dict[str, dict[int, list[Holding]]],
                 pushes: list[Push]) -> None:
        """``node_of[rank]``: each side-group rank's node; ``reports``: each node's holdings."""
        self.ctx, self.node_of, self.reports, self.pushes = ctx, node_of, reports, pushes
        self._posted: list[tuple[Push, list[Any], bytearray]] = []
        self._received: dict[str, tuple[Push, list[Any], bytearray]] = {}
        self._landed: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._group: Any = None

    @classmethod
    def begin(cls, ctx: RestoreContext) -> EarlyPush:
        """Gather every node's holdings (its lowest rank reports) and post this rank's pushes."""
        assert ctx.level is not None and ctx.local is not None
        group, level = ctx.group, ctx.level
        node_of = [level.node] * group.world_size
        for peer in level.peers:
            if peer.rank < group.world_size:
                node_of[peer.rank] = peer.node
        mine = node_holdings(ctx.local) if node_of.index(level.node) == group.rank else None
        gathered = group.broadcast_from_rank0(group.gather_to_rank0((level.node, mine)))
        reports = {node: held for node, held in gathered if held is not None}
        exchange = ctx.options.exchange and moves_cpu_tensors(group.group, group.world_size)
        cap = ctx.options.concurrency * ctx.options.chunk_bytes
        push = cls(ctx, node_of, reports, plan_pushes(reports, node_of, cap_bytes=cap) if exchange else [])
        if push.pushes:  # every rank derived the same plan: all create the group, or none
            push._group = dist.new_group(backend="gloo")
            push._post(group.rank)
        return push

    def _post(self, rank: int) -> None:
        assert self.ctx.local is not None
        for push in self.pushes:
            if rank not in (push.sender, push.receiver):
                continue
            data, works = bytearray(push.size), []
            key = partner_copy_key(push.step, push.name)
            for i, (offset, length) in enumerate(push.pieces()):
                piece = torch.frombuffer(data, dtype=torch.uint8, offset=offset, count=length)
                if rank == push.receiver:
                    works.append(recv_async(piece, self._group, push.sender, push.tag + i))
                    continue
                try:  # bytes that fail to read still go (zeros): the receiver waits for them, then refuses them
                    self.ctx.local.readinto(key, memoryview(data)[offset:offset + length], offset=offset)
                except CkptError as exc:
                    log.warning("ckptio: partner copy of %s unreadable for its push: %s", push.name, exc)
                works.append(send_async(piece, self._group, push.receiver, push.tag + i))
            if rank == push.receiver:
                self._received[push.name] = (push, works, data)
            self._posted.append((push, works, data))

    def held(self, manifest: Manifest) -> Held:
        """Where ``manifest``'s files are, from the reports (copies of the recorded size), the nodes this restore
        pushes a file to among them."""
        held = Held({name: [] for name in manifest.files}, set())
        for node, steps in sorted(self.reports.items()):
            for name, own, size in steps.get(manifest.step, []):
                rec = manifest.files.get(name)
                if rec is None or size != rec.size:
                    continue
                if node not in held.nodes[name]:
                    held.nodes[name].append(node)
                if own:
                    held.owned.add(name)
        for push in self.pushes:
            rec, receiver_node = manifest.files.get(push.name), self.node_of[push.receiver]
            if push.step == manifest.step and rec is not None and rec.size == push.size and \
                    receiver_node not in held.nodes[push.name]:
                held.nodes[push.name].append(receiver_node)
        return held

    def pushed_to(self, step: int) -> dict[str, int]:
        """Every file of ``step`` this restore pushes (on any rank): name → the rank it is pushed to."""
        return {push.name: push.receiver for push in self.pushes if push.step == step}

    def landings(self, step: int) -> dict[str, Callable[[Callable[[Landed], bool]], bool]]:
        """The files of ``step`` pushed to this rank: name → ``land(check)``, which waits for the file's pieces,
        hashing each as it lands, and puts the file in this node's partner area only when ``check`` accepts what
        arrived (True then)."""
        return {name: functools.partial(self._land, name) for name, (push, _, _) in self._received.items()
                if push.step == step}

    def _land(self, name: str, check: Callable[[Landed], bool]) -> bool:
        assert self.ctx.local is not None
        with self._lock:
            if name in self._landed:
                return self._landed[name]
            push, works, data = self._received[name]
            running, hasher, view = 0, new_hasher(), memoryview(data)
            try:
                for work, (offset, length) in zip(works, push.pieces(), strict=True):
                    work.wait()
                    running = crc32c(view[offset:offset + length], running)
                    hasher.update(view[offset:offset + length])
                ok = check(Landed(push.size, f"{running:08x}", finish(hasher)))
                if ok:
                    self.ctx.local.put(partner_copy_key(push.step, name), view)
            except (RuntimeError, OSError, CkptError) as exc:
                log.warning("ckptio: the push of %s from rank %s did not land: %s", name, push.sender, exc)
                ok = False
            self._landed[name] = ok
            return ok

    def finish(self) -> None:
        """Wait every send and receive this rank posted (a failure is logged: the restore already chose without
        it), then drop the buffers."""
        for push, works, _ in self._posted:
            if push.name in self._landed and push.receiver == self.ctx.group.rank:
                continue  # waited when it landed
            try:
                for work in works:
                    work.wait()
            except RuntimeError as exc:
                log.warning("ckptio: the push of %s (rank %s → %s) failed: %s", push.name, push.sender,
                            push.receiver, exc)
        self._posted.clear()
        self._received.clear()
        if self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None


__all__ = ["EarlyPush", "Held", "Holding", "Landed", "Push", "node_holdings", "plan_pushes"]
