"""The local level in the writer process: this node's partner server, the copies of this rank's files to its
partner ranks, this rank's index in the local level's records, and the level's commit.

:class:`LocalLevel` owns the level's records (``format.local_level_records``), its
:class:`~ckptio.engine.writer.step_committer.StepCommitter` (keeping the newest step only: the local level is the
fast way back, the durable one the safe one), its partner server and its failure rule: a failure in its own part
(the copies and the index, its commit, or no room on the local tier) stops this level only, and its marker goes to
the local level's records. The job pipeline hands over the files it wrote to this node's ``local_dir``; the copies
and the index then run on the level's committer thread, never on the job pipeline: a partner that stops answering
must never hold a staging slot, so it can cost the training thread nothing.

A partner that takes no copy costs the save its redundancy, not the save: the rank index records the nodes that do
hold each file (its own node first), a ``replica_failed`` event says which partner failed and why, and the step
commits on the local level. A partner that failed is not tried again for ``partner_timeout_s`` (each later save
skips it at once and says so): a stopped partner would otherwise cost every save a full timeout and pile saves up
behind it.

It never touches a process group, never reads a staging slot, never deletes in ``local_dir`` itself (the local
tier does), and never writes the durable level's records.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.partner import PartnerLimits, PartnerServer, file_digest, send_files
from ckptio.engine.partner.client import copy_rate
from ckptio.engine.protocol import LevelsStart, Outbox, SaveJob, WriterStart
from ckptio.engine.writer.first_tier import SavedFiles
from ckptio.engine.writer.flush_pacer import FlushPacer
from ckptio.engine.writer.level_cleanup import CommittedSteps
from ckptio.engine.writer.level_outcome import Attempt, LevelOutcome
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.local_tier import LocalTier
from ckptio.engine.writer.step_committer import CommitLevel, CommitRequest, StepCommitter
from ckptio.errors import ReplicationError, StorageFullError
from ckptio.format import FileRecord, ItemRecord, RankIndex, committed_steps, index_key
from ckptio.format.layout import data_file_name
from ckptio.format.local_level_records import own_copy_key
from ckptio.obs.events import Event, Phase
from ckptio.storage.base import Pacer


class LocalLevel:
    """One writer's part of the local level."""

    name = "local"

    def __init__(self, start: WriterStart, out: Outbox, live: LiveSteps, *, tier: LocalTier,
                 markers: FailureMarkers, committed: CommittedSteps, durable: CommittedSteps,
                 pacer: FlushPacer | None = None) -> None:
        assert start.levels is not None
        self.start, self.out, self.tier = start, out, tier
        self.records = committed.records
        self.outcome = LevelOutcome(self.name, start, out, live, markers=markers, discard=self._discard)
        self.copies = PartnerCopies(start, out, start.levels, tier, pacer or FlushPacer())
        self.committer = StepCommitter(
            CommitLevel(self.name, committed, keep_last=1, retire_also=(durable,), after_commit=tier.evict_below),
            start, out, live, outcome=self.outcome)

    def take(self, saved: SavedFiles, attempt: Attempt) -> None:
        """Copy ``saved``'s files to the partners, write this rank's index and commit, on the level's thread."""
        job = saved.job
        if not saved.on_local:  # the local tier was full: this save holds nothing on the local level
            error = StorageFullError("local level: the local tier had no room for this save",
                                     root=self.tier.storage.url, step=job.step, rank=self.start.rank)
            self.outcome.failed(attempt, error)
            return

        def prepare() -> None:
            index = self.copies.replicate(job, saved.files, saved.items)
            self.records.put(index_key(job.step, self.start.rank), index.to_json())

        self.committer.submit(CommitRequest(attempt=attempt, metadata_skeleton=saved.plan.metadata_skeleton,
                                            rollback=job.rollback, replaces=job.replaces, prepare=prepare))

    def _discard(self, attempt: Attempt) -> None:
        # The durable level still uploads this attempt's local files when the save goes there too.
        if not attempt.levels.durable:
            self.tier.discard(attempt.step, [data_file_name(self.start.rank, n, attempt.save_id)
                                             for n in range(attempt.n_files)])

    def close(self) -> None:
        """Finish the queued commits, stop the partner server, and drop the copies it received for steps that did
        not commit (the next writer's evictions would only find them once a later step commits)."""
        self.committer.close()
        self.copies.server.close()
        self.tier.drop_partner_copies(self.copies.server.received(), committed=set(committed_steps(self.records)))


class PartnerCopies:
    """This rank's partner server, and the copies of its files to its partner ranks."""

    def __init__(self, start: WriterStart, out: Outbox, levels: LevelsStart, tier: LocalTier,
                 pacer: FlushPacer) -> None:
        self.start, self.out, self.levels, self.local = start, out, levels, tier.storage
        self.peers = {peer.rank: peer for peer in levels.peers}
        limits = PartnerLimits.for_timeout(levels.timeout_s)
        self.server = PartnerServer(socket.socket(fileno=levels.listen_fd), self.local, secret=levels.secret,
                                    limits=limits)
        self._down_until: dict[int, float] = {}
        # ``partner_pace``: the copies take the writer's flush pacer, so they go at full speed whenever a paced
        # flush does (the next save, an emergency save, close()); the node's budget is shared by its ranks.
        self.pacer = pacer
        on_node = sum(peer.node == levels.node for peer in levels.peers)
        self.copy_rate = copy_rate(start.config.partner_pace, on_node, limits)

    def replicate(self, job: SaveJob, files: list[FileRecord], items: list[ItemRecord]) -> RankIndex:
        """Copy to each partner that answers; returns this rank's index, whose file records name the holders (own
        node first) and each file's digest, hashed from the bytes sent to the first partner (without one, from
        disk: a restore on another node may still fetch these files, and only a digest lets it use them)."""
        holders = [self.levels.node]
        sendable = [(rec.name, self.server.directory.local_path(own_copy_key(job.step, rec.name)), rec.size, rec.crc32c)
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
        files = [replace(rec, holders=list(holders), digest=digests[rec.name]) for rec in files]
        return RankIndex(step=job.step, rank=self.start.rank, world_size=self.start.world_size,
                         save_id=job.save_id, files=files, items=items)

    def _send(self, job: SaveJob, partner: int, sendable: list[tuple[str, str, int, str]],
              digests: dict[str, str] | None, pacer: Pacer | None) -> dict[str, str]:
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
