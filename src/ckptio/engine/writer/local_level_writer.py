"""The local level in the writer process: this node's partner server, the copies of this rank's files to its
partner ranks, and this rank's index in the local level's records.

For each local-level save the job pipeline hands over the files it wrote to this node's ``local_dir``; the local
level's :class:`~ckptio.engine.writer.step_committer.StepCommitter` thread then runs :meth:`LocalLevelWriter.prepare`
(copies, then the rank index) before it commits or watches, exactly as the durable level does. The copies run on that
thread, never on the job pipeline: a partner that stops answering must never hold a staging slot, so it can cost
the training thread nothing.

A partner that takes no copy costs the save its redundancy, not the save: the rank index records the nodes that do
hold each file (its own node first), a ``replica_failed`` event says which partner failed and why, and the step
commits on the local level. A partner that failed is not tried again for ``partner_timeout_s`` (each later save
skips it at once and says so): a stopped partner would otherwise cost every save a full timeout and pile saves up
behind it.

It never touches a process group, never reads a staging slot, and never writes the durable level's records.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from ckptio.engine.partner import PartnerLimits, PartnerServer, file_digest, send_files
from ckptio.engine.partner.client import copy_rate
from ckptio.engine.protocol import LevelsStart, Outbox, SaveJob, WriterStart
from ckptio.engine.writer.flush_pacer import FlushPacer
from ckptio.errors import ReplicationError
from ckptio.format import FileRecord, ItemRecord, RankIndex, committed_steps, index_key
from ckptio.format.local_level import own_copy_key
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import Pacer, Storage


class LocalLevelWriter:
    """One writer's part of the local level: partner server, replication, rank index."""

    def __init__(self, start: WriterStart, out: Outbox, records: Storage, pacer: FlushPacer | None = None) -> None:
        assert start.levels is not None and start.local is not None
        self.start, self.out, self.records = start, out, records
        self.levels: LevelsStart = start.levels
        self.local = start.local
        self.peers = {peer.rank: peer for peer in self.levels.peers}
        self.server = PartnerServer(socket.socket(fileno=self.levels.listen_fd), self.local, secret=self.levels.secret,
                                    limits=PartnerLimits.for_timeout(self.levels.timeout_s))
        self._down_until: dict[int, float] = {}
        # partner_pace (lab helper, issue 19 item 4): the copies take the writer's flush pacer, so they go full speed
        # whenever a paced flush would.
        self.pacer = pacer or FlushPacer()
        on_node = sum(peer.node == self.levels.node for peer in self.levels.peers)
        self.copy_rate = copy_rate(start.config.partner_pace, on_node, PartnerLimits.for_timeout(self.levels.timeout_s))

    def prepare(self, job: SaveJob, files: list[FileRecord], items: list[ItemRecord]) -> None:
        """Copy the files to the partners that answer, then write this rank's index (runs on the level's thread)."""
        holders, digests = self._replicate(job, files)
        files = [replace(rec, holders=list(holders), digest=digests[rec.name]) for rec in files]
        index = RankIndex(step=job.step, rank=self.start.rank, world_size=self.start.world_size,
                          save_id=job.save_id, files=files, items=items)
        self.records.put(index_key(job.step, self.start.rank), index.to_json())

    def _replicate(self, job: SaveJob, files: list[FileRecord]) -> tuple[list[str], dict[str, str]]:
        """Copy to each partner that answers; returns the holders (own node first) and each file's digest, hashed
        from the bytes sent to the first partner (without one, from disk: a restore on another node may still
        fetch these files, and only a digest lets it use them)."""
        holders = [self.levels.node]
        sendable = [(rec.name, self.local.local_path(own_copy_key(job.step, rec.name)), rec.size, rec.crc32c)
                    for rec in files]
        t0 = time.monotonic()
        digests: dict[str, str] | None = None
        sent = 0
        with self.pacer.begin(self.copy_rate) as flush:
            for partner in self.levels.partner_ranks:
                node = self.peers[partner].node
                try:
                    digests = self._send(job, partner, sendable, digests, flush.pacer)
                except ReplicationError as exc:
                    self.out.event(Event.REPLICA_FAILED, job.step, partner=partner, node=node, error=str(exc))
                    continue
                holders.append(node)
                sent += 1
        if digests is None:
            digests = {name: file_digest(path) for name, path, _, _ in sendable}
        self.out.event(Event.PHASE, job.step, phase=Phase.REPLICATE, seconds=time.monotonic() - t0,
                       bytes=sum(f.size for f in files) * sent, tier="partner",
                       partners=list(self.levels.partner_ranks))
        return holders, digests

    def _send(self, job: SaveJob, partner: int, sendable: list[tuple[str, str, int, str]],
              digests: dict[str, str] | None, pacer: Pacer | None = None) -> dict[str, str]:
        """One partner's copies, unless it failed within the last ``partner_timeout_s`` (ReplicationError)."""
        peer = self.peers[partner]
        who = f"rank {partner} on node {peer.node!r}"
        if time.monotonic() < self._down_until.get(partner, 0.0):
            raise ReplicationError(f"partner {who} failed a copy in the last {self.levels.timeout_s:.0f} s; not tried "
                                   "again before then", step=job.step)
        try:
            sent = send_files(peer.host, peer.port, job.step, sendable, secret=self.levels.secret, digests=digests,
                              timeout_s=self.levels.timeout_s, who=who, pacer=pacer)
        except ReplicationError:
            self._down_until[partner] = time.monotonic() + self.levels.timeout_s
            raise
        self._down_until.pop(partner, None)
        return sent

    def close(self) -> None:
        # Copies received for steps that never committed go with this writer (the next writer's evictions would
        # only find them once a later step commits).
        self.server.close(keep_steps=committed_steps(self.records))
