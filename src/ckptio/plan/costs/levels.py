"""The inputs of the two-level model: the node-local level, the failure classes, and each level's times.

Owns what the multi-level model (:mod:`ckptio.plan.costs.multilevel`) and the failure simulator
(:mod:`ckptio.plan.simulation.failure_injection`) both read: the local level as the planner sees it
(:class:`LocalLevel`: per-node bandwidths, replicas, ranks per node), the job's failures split into the classes that
decide which level can restore (:class:`FailureRates`), and the seconds each level takes to commit a save and to restore
one (:class:`LevelTimes`). It must never optimize a schedule (``multilevel`` does) nor draw a failure
(:mod:`ckptio.plan.simulation.failure_injection`).

The failure classes (each a Poisson process; the rates add up to the job's ``1/MTBF``):

* ``soft`` — an interruption that leaves every node's local copy in place (a software fault, a collective
  timeout, a fabric hiccup): restored from each rank's own local tier.
* ``node`` — a node is lost with its local copy (a GPU, host or NIC failure; the job restarts without it): the
  lost node's shards come from a partner copy, unless every one of its ``replicas`` partners is lost too within
  the window the copy is needed (:meth:`FailureRates.partner_coverage`); then from the durable tier.
* ``job`` — a failure no local copy survives (correlated loss of many nodes, a restart on another allocation,
  a local tier in memory that dies with the job): restored from the durable tier.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ckptio.errors import ConfigError
from ckptio.plan.costs.budget import BurstBudget
from ckptio.plan.costs.inputs import DEFAULT_NETWORK_BYTES_PER_S, DEFAULT_RANKS_PER_NODE, Network
from ckptio.plan.costs.readback import ReadSource, RestoreTime, durable_restore, restore_time
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointShape

NODE_LOSS_SHARE = 0.78
"""Default share of a job's interruptions that lose one node: Llama 3 405B's pre-training attributed 78% of its
419 unexpected interruptions to confirmed or suspected hardware ("The Llama 3 Herd of Models", Meta, 2024, §3.3.4);
each took a GPU or host out of the job."""

PREEMPTION_STEPS = 3
"""Training steps between a SIGTERM and the emergency save's copy under ``maybe_save``: the step under way, then the
two calls the non-blocking vote takes to agree the preemption on every rank (``engine.trainer.maybe_save_votes``)."""

JOB_LOSS_SHARE = 0.05
"""Default share no local copy survives: an assumption (no public breakdown gives it). Give ``--job-loss-mtbf``
from the cluster's own records."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LocalLevel:
    """The node-local level: each node's own tier plus ``replicas`` partner copies on other nodes."""

    bytes_per_s: float
    """Write bandwidth of one node's local tier (NVMe, or RAM for a tmpfs), shared by its ranks."""

    read_bytes_per_s: float | None = None
    """Read bandwidth of one node's local tier; None: the write bandwidth."""

    network_bytes_per_s: float = DEFAULT_NETWORK_BYTES_PER_S
    """One node's network bandwidth, each direction: partner copies and the restore's exchange between ranks."""

    replicas: int = 1
    """Partner nodes holding a copy of each node's shards (0: the local level covers no node loss)."""

    ranks_per_node: int = DEFAULT_RANKS_PER_NODE
    """Ranks sharing one node's local tier and NIC."""

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or self.replicas < 0:
            raise ConfigError(f"replicas must be an integer >= 0, got {self.replicas!r}")
        if not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 1:
            raise ConfigError(f"ranks per node must be an integer >= 1, got {self.ranks_per_node!r}")
        for name in ("bytes_per_s", "read_bytes_per_s", "network_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"local level {name} must be a positive number, got {value!r}")

    @property
    def read_rate(self) -> float:
        return self.read_bytes_per_s or self.bytes_per_s

    def nodes(self, ranks: int) -> int:
        return max(1, math.ceil(ranks / self.ranks_per_node))

    def bytes_per_node(self, shape: CheckpointShape) -> float:
        """Bytes the fullest node holds of one checkpoint: its ranks × the largest rank (a node holds one TP
        group, whose ranks are alike)."""
        return shape.bytes_per_rank_max * min(self.ranks_per_node, shape.ranks)

    def flush_s(self, shape: CheckpointShape) -> float:
        """Seconds from a save's copy to its local level committed: the node writes its own bytes and the
        ``replicas`` partners' it receives to its tier, and sends its bytes to ``replicas`` partners; the two
        overlap, so the slower sets the time."""
        b = self.bytes_per_node(shape)
        return max((1 + self.replicas) * b / self.bytes_per_s, self.replicas * b / self.network_bytes_per_s)

    @property
    def network(self) -> Network:
        return Network(bytes_per_s=self.network_bytes_per_s, ranks_per_node=self.ranks_per_node)

    def restore_local(self, shape: CheckpointShape) -> RestoreTime:
        """Every node restores from its own tier, all nodes at once (:mod:`~ckptio.plan.costs.readback`): bytes a
        group shares are read by the ranks whose nodes hold a copy — the writer and its ``replicas`` partners, the
        next DP replicas — and sent to the rest."""
        source = ReadSource(bytes_per_s=self.read_rate, per_node=True, readers=1 + self.replicas)
        return restore_time(shape, source, self.network)

    def restore_local_s(self, shape: CheckpointShape) -> float:
        return self.restore_local(shape).total_s

    def restore_partner_s(self, shape: CheckpointShape) -> float | None:
        """One node was lost: its replacement's ranks receive the lost node's bytes from its ``replicas`` partners
        (each reads a 1/replicas share besides its own restore), the rest as a local restore. None without
        replicas."""
        if self.replicas == 0:
            return None
        local = self.restore_local(shape)
        lost = self.bytes_per_node(shape)
        return max(local.total_s, (local.node_read_bytes + lost / self.replicas) / self.read_rate,
                   (local.node_exchange_bytes + lost) / self.network_bytes_per_s)


@dataclass(kw_only=True, slots=True, frozen=True)
class FailureRates:
    """The job's failures per second, per class (see the module docstring)."""

    soft: float
    """Interruptions that leave every local copy in place."""
    node: float
    """Losses of one node (all nodes together: nodes ÷ node MTBF)."""
    job: float
    """Failures no local copy survives."""
    node_mtbf_s: float
    """Mean time between losses of one given node."""

    def __post_init__(self) -> None:
        for name in ("soft", "node", "job"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} failure rate must be >= 0, got {value!r}")
        if not self.total > 0:
            raise ConfigError("the job needs a failure rate > 0")

    @property
    def total(self) -> float:
        return self.soft + self.node + self.job

    def partner_coverage(self, replicas: int, window_s: float) -> float:
        """Probability a lost node's shards are still on some partner: not every one of its ``replicas``
        partners is lost (independently, at the node rate) within ``window_s``, the time until the restored
        job has a fresh replicated copy."""
        if replicas == 0:
            return 0.0
        return 1.0 - (-math.expm1(-window_s / self.node_mtbf_s)) ** replicas

    def to_json(self) -> dict[str, float]:
        return {**asdict(self), "mtbf_s": 1.0 / self.total}


def failure_rates(*, mtbf_s: float, nodes: int, node_mtbf_s: float | None = None,
                  job_loss_mtbf_s: float | None = None, mtbf_given: bool = True) -> FailureRates:
    """Split the job's ``1/mtbf_s`` into the three classes; ``soft`` takes what the other two leave.

    Defaults: node losses are :data:`NODE_LOSS_SHARE` of the interruptions, job losses :data:`JOB_LOSS_SHARE`.
    Explicit node and job rates above the job's rate are an error when ``mtbf_given``; otherwise (the MTBF was
    a default) they set the total.
    """
    for name, value in (("--mtbf", mtbf_s), ("--node-mtbf", node_mtbf_s), ("--job-loss-mtbf", job_loss_mtbf_s)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{name} must be a positive duration, got {value!r}")
    total = 1.0 / mtbf_s
    node = nodes / node_mtbf_s if node_mtbf_s is not None else NODE_LOSS_SHARE * total
    job = 1.0 / job_loss_mtbf_s if job_loss_mtbf_s is not None else JOB_LOSS_SHARE * total
    if node + job > total * (1 + 1e-9):
        if mtbf_given:
            raise ConfigError(
                f"--node-mtbf and --job-loss-mtbf give {node + job:.3g} failures/s for the job, more than "
                f"--mtbf's {total:.3g}/s: the MTBF counts every interruption; lengthen them or shorten --mtbf"
            )
        total = node + job
    return FailureRates(soft=max(0.0, total - node - job), node=node, job=job,
                        node_mtbf_s=node_mtbf_s if node_mtbf_s is not None else nodes / node)


@dataclass(kw_only=True, slots=True, frozen=True)
class LevelTimes:
    """What a save and a restore take at each level, for the job's slowest node or rank."""

    blocking_s: float
    """``save()`` holds training this long (the copy) before the levels' writes go on in the background."""
    local_flush_s: float | None
    """Copy done → local level committed (own tier + partner copies); None without a local level."""
    durable_flush_s: float
    """Copy done → durable level committed (the burst of every rank at once)."""
    restore_local_s: float | None
    """Every rank reads its own local copy."""
    restore_partner_s: float | None
    """A lost node's shards come from partners; None without replicas."""
    restore_durable_s: float
    """Every rank reads the durable tier at once."""
    durable_restore_measured: bool = True
    """False when the store's read bandwidth is unknown and the write bandwidth stood in for it."""
    synchronous: bool = False
    """Training waits for each level's write (``--mode sync``) instead of only for the copy."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def restore_json(self) -> dict[str, float | None]:
        """``plan --json``'s ``restore_s``: per level; durable is null when the read bandwidth is unknown."""
        return {"local": self.restore_local_s, "partner": self.restore_partner_s,
                "durable": self.restore_durable_s if self.durable_restore_measured else None}


def emergency_grace_s(times: LevelTimes, step_time_s: float | None) -> float | None:
    """The grace period a preemption must leave for the emergency save to commit on the local level: the steps
    until ``maybe_save`` acts (:data:`PREEMPTION_STEPS`; none counted without a step time), the copy, and the
    local commit (own tier plus partner copies). None without a local level. A save still holding the only staging
    slot (``max_pending=1``) comes first: add its flush, or give ``max_pending=2``."""
    if times.local_flush_s is None:
        return None
    return PREEMPTION_STEPS * (step_time_s or 0.0) + times.blocking_s + times.local_flush_s


def level_times(shape: CheckpointShape, storage: StoreLimits, budget: BurstBudget,
                local: LocalLevel | None, network: Network | None = None) -> LevelTimes:
    """Each level's commit and restore times for ``shape`` on ``storage`` (``budget`` gives blocking and the
    durable flush; ``network`` the restore's exchange, by default the local level's or :class:`Network`'s)."""
    network = network or (local.network if local else Network())
    durable = durable_restore(shape, storage, network)
    measured = durable is not None
    if durable is None:  # without a read figure, reads are taken as fast as writes
        durable = durable_restore(shape, replace(storage, read_bytes_per_s=storage.write_bytes_per_s), network)
    return LevelTimes(
        blocking_s=budget.blocking_s,
        local_flush_s=local.flush_s(shape) if local else None,
        durable_flush_s=budget.flush_s,
        restore_local_s=local.restore_local_s(shape) if local else None,
        restore_partner_s=local.restore_partner_s(shape) if local else None,
        restore_durable_s=durable.total_s if durable else 0.0,
        durable_restore_measured=measured,
        synchronous=budget.mode == "sync",
    )
