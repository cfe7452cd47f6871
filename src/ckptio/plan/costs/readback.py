"""How long a restore takes: the model ckptio's restore follows, in closed form per group of ranks.

The engine reads each stored byte once across the job and spreads the reading over the ranks that need it; every
other rank that needs those bytes receives them from the reader over ckptio's side group
(:mod:`ckptio.engine.restore.read_plan`, docs/restore.md). The model runs that same assignment
(:func:`ckptio.engine.restore.read_plan.read_shares`) over the job's layout — per :class:`~ckptio.plan.job.checkpoint.
ReplicaGroup`, the bytes its first rank wrote for all of them, then each rank's own — and gets each rank's bytes
read, sent and received. The restore then takes the slowest of:

* **the reads**: every rank reads its share at once. From a shared store (the durable level) the ranks share its
  aggregate read bandwidth max-min fairly, each capped at its own client's rate
  (:func:`~ckptio.plan.costs.fairshare.fair_share_flush_s`), so the rank that reads the most gates once the store
  has bandwidth to spare; from a node's own tier (the local level) the node's ranks share that tier, and the node
  that reads the most gates;
* **the exchange**: the node whose ranks send or receive the most, over its NIC, each direction on its own
  (:class:`~ckptio.plan.costs.inputs.Network`);
* **the metadata**: one open per object on a POSIX store, when its rate is known.

They overlap (the engine keeps several reads, checks and transfers in flight), so the slowest sets the time. Left
out, each small beside them on the hosts this models: the crc32c check of every block (about 10 GB/s per core),
the copy into the model (ranges land in the target tensors' own memory), an object store's per-request latency
(ranges of 16–128 MiB, many in flight), and the metadata and plan exchanged before the reads. The figures the model
was held to are in docs/planning-measurements.md (``bench/bench_restore.py`` prints predicted ÷ measured).

This module must never touch storage or processes; :mod:`ckptio.plan.costs.levels` applies it to each level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptio.engine.restore.read_plan import ReadShares, read_shares
from ckptio.plan.costs.fairshare import fair_share_flush_s
from ckptio.plan.costs.inputs import Network
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointShape, ReplicaGroup

MAX_GROUP_RANKS = 16384
"""Ranks of one group the model assigns one by one. A larger group (a data-parallel degree no job reaches) is priced
as this many ranks holding the same bytes per rank, its sends and receives scaled back to its size."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ReadSource:
    """Where a restore reads the stored bytes from."""

    bytes_per_s: float
    """Read bandwidth: the whole job's (a shared store) or one node's (``per_node``)."""

    per_node: bool = False
    """True for a node's own tier (the local level), shared by the node's ranks only."""

    per_reader_bytes_per_s: float = math.inf
    """Cap of one rank's reads (its client), when known: then the rank that reads the most gates the restore even
    when the store has bandwidth to spare. Without one, a shared store moves every byte at its aggregate rate."""

    readers: int | None = None
    """Ranks of each group that hold a copy and may read it: the writer and its partner copies on the next nodes
    (the local level: 1 + replicas, the next DP replicas with data parallelism across nodes). None: any rank."""

    metadata_ops_per_s: float | None = None
    """Opens per second (a POSIX store), when known."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RestoreTime:
    """One restore by each limit alone, and the worst node's bytes (the partner level builds on them)."""

    read_s: float
    """The reads at the source's bandwidth."""
    exchange_s: float
    """The side group's sends and receives at the network's bandwidth."""
    metadata_s: float
    """One open per object."""
    node_read_bytes: float
    """Bytes the node that reads the most reads."""
    node_exchange_bytes: float
    """Bytes the node that exchanges the most sends or receives (the larger direction)."""

    @property
    def total_s(self) -> float:
        return max(self.read_s, self.exchange_s, self.metadata_s)


@dataclass(kw_only=True, slots=True, frozen=True)
class _GroupShares:
    read: list[float]
    """Per modelled rank: its bytes read."""
    exchanged: list[float]
    """Per modelled rank: the larger of its bytes sent and received."""
    weight: float
    """Ranks of the job each modelled rank stands for (the groups alike, and a group priced smaller)."""


def group_shares(group: ReplicaGroup, *, readers: int | None = None) -> ReadShares:
    """Each rank's bytes read, sent and received when ``group`` restores: the bytes its first rank wrote for all
    of them (readable by its first ``readers`` ranks, or any), then each rank's own, as the engine assigns them."""
    n = group.ranks
    everyone = frozenset(range(n))
    regions = [(round(group.shared_bytes), everyone)] + [(round(group.own_bytes), frozenset({r})) for r in range(n)]
    allowed = {0: list(range(min(readers, n)))} if readers is not None else None
    return read_shares(regions, n, readers=allowed)


def _shares(group: ReplicaGroup, readers: int | None) -> _GroupShares:
    n = group.ranks
    if n <= MAX_GROUP_RANKS:
        shares = group_shares(group, readers=readers)
        exchanged = [float(max(s, r)) for s, r in zip(shares.sent, shares.received, strict=True)]
        return _GroupShares(read=[float(b) for b in shares.read], exchanged=exchanged, weight=group.count)
    # Priced at MAX_GROUP_RANKS ranks reading the same bytes each: spread over any rank, the shared bytes shrink
    # with the group (over a few holders, they stay whole); what a rank sends grows with its receivers, and every
    # rank receives all the shared bytes it did not read.
    shared = group.shared_bytes if readers is not None else group.shared_bytes * MAX_GROUP_RANKS / n
    small = ReplicaGroup(count=1, ranks=MAX_GROUP_RANKS, shared_bytes=shared, own_bytes=group.own_bytes)
    shares = group_shares(small, readers=readers)
    grow = (n - 1) / (MAX_GROUP_RANKS - 1)
    exchanged = [max(s * grow, r + group.shared_bytes - small.shared_bytes)
                 for s, r in zip(shares.sent, shares.received, strict=True)]
    return _GroupShares(read=[float(b) for b in shares.read], exchanged=exchanged,
                        weight=group.count * n / MAX_GROUP_RANKS)


def restore_time(shape: CheckpointShape, source: ReadSource, network: Network) -> RestoreTime:
    """Seconds for every rank of ``shape`` to restore at once from ``source``, exchanging over ``network``."""
    shares = [_shares(g, source.readers) for g in shape.replica_groups()]
    per_node = min(network.ranks_per_node, max(1, shape.ranks))
    # A node holds alike ranks (a TP group of one position), so its worst is its ranks × the worst rank's bytes.
    node_read = per_node * max(max(s.read) for s in shares)
    node_exchange = per_node * max(max(s.exchanged) for s in shares)
    if source.per_node:
        read_s = node_read / source.bytes_per_s
    else:
        reads: dict[float, float] = {}
        for s in shares:
            for nbytes in s.read:
                reads[nbytes] = reads.get(nbytes, 0.0) + s.weight
        read_s = fair_share_flush_s([(w, nbytes) for nbytes, w in reads.items()], source.bytes_per_s,
                                    source.per_reader_bytes_per_s)
    metadata_s = shape.objects / source.metadata_ops_per_s if source.metadata_ops_per_s else 0.0
    return RestoreTime(read_s=read_s, exchange_s=node_exchange / network.bytes_per_s, metadata_s=metadata_s,
                       node_read_bytes=node_read, node_exchange_bytes=node_exchange)


def durable_restore(shape: CheckpointShape, storage: StoreLimits, network: Network) -> RestoreTime | None:
    """Every rank restores from the shared store at once; None when its read bandwidth is unknown."""
    if not storage.read_bytes_per_s:
        return None
    ops = storage.metadata_ops_per_s if storage.kind == "posix" else None
    # A rank's client caps its reads as it caps its writes: the per-writer figure stands in for a per-reader one.
    source = ReadSource(bytes_per_s=storage.read_bytes_per_s, per_reader_bytes_per_s=storage.per_writer_bytes_per_s,
                        metadata_ops_per_s=ops)
    return restore_time(shape, source, network)
