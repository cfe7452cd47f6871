"""The two-level flags ``plan`` and ``simulate`` share, and the objects built from them.

Owns the command-line spelling of the node-local level (per-node bandwidths, replicas, ranks per node), the
failure classes (``--node-mtbf``, ``--job-loss-mtbf``), the store budget (``--durable-share``) and a schedule to
evaluate (``--local-every``, ``--durable-every``). Values stay strings until built here, so every bad value
becomes a :class:`~ckptio.errors.ConfigError` naming its flag (exit code 2). Not a subcommand.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ckptio._cli.job_args import (
    MIN_MTBF_S,
    duration_flag,
    fraction_flag,
    int_flag,
    interval_flag,
    rate_flag,
    size_flag,
)
from ckptio.errors import ConfigError
from ckptio.plan.costs.inputs import DEFAULT_NETWORK_BYTES_PER_S, DEFAULT_RANKS_PER_NODE, Network
from ckptio.plan.costs.levels import LocalLevel
from ckptio.plan.units import parse_duration, quoted


def add_level_arguments(parser: argparse.ArgumentParser, *, shared_with_tiered: bool = False) -> None:
    """The two-level group; ``shared_with_tiered``: the parser already has ``--local-bandwidth`` and
    ``--ranks-per-node`` (``simulate``'s tiered mode), which mean the same here."""
    g = parser.add_argument_group("two levels (node-local saves with partner copies, every k-th durable)")
    if not shared_with_tiered:
        g.add_argument("--local-bandwidth", help="one node's local tier write bandwidth (5GB/s): plans two levels")
        g.add_argument("--ranks-per-node", default=str(DEFAULT_RANKS_PER_NODE),
                       help=f"ranks sharing a node's local tier and NIC ({DEFAULT_RANKS_PER_NODE})")
    g.add_argument("--local-read-bandwidth", help="one node's local tier read bandwidth (--local-bandwidth)")
    g.add_argument("--network-bandwidth",
                   help="one node's network bandwidth, each direction: partner copies, and restore's exchange between "
                   f"ranks at every level ({DEFAULT_NETWORK_BYTES_PER_S / 1e9:g}GB/s)")
    g.add_argument("--collective-bytes",
                   help="bytes one rank's collectives send per step through the NIC the store's traffic also leaves "
                   "by (a ring all-reduce of G bytes over N ranks: 2(N-1)/N x G); the save's bytes then cost the "
                   "steps network time (default 0: the store is reached over another network)")
    g.add_argument("--replicas", default="1", help="partner nodes holding a copy of each node's shards (1)")
    g.add_argument("--node-mtbf", help="mean time between losses of one node with its local copy "
                   "(default: 78%% of the job's interruptions, Llama 3's hardware share)")
    g.add_argument("--job-loss-mtbf", help="mean time between failures no local copy survives "
                   "(default: 5%% of the job's interruptions)")
    g.add_argument("--durable-share", default="1",
                   help="most of the durable store's time the job's flushes may take, 0-1 (1: no limit)")
    g.add_argument("--local-every", help="evaluate this local interval (steps or duration) instead of the optimum")
    g.add_argument("--durable-every", help="evaluate: every k-th local save also goes durable (default: optimum)")


@dataclass(kw_only=True, slots=True, frozen=True)
class LevelArgs:
    """The two-level flags, built and validated."""

    local: LocalLevel | None
    """The local level; None without ``--local-bandwidth``."""
    network: Network
    """``--network-bandwidth`` and ``--ranks-per-node``: what a restore's exchange between ranks crosses."""
    ranks_per_node: int
    """Ranks per node (also without a local level: node losses scale with nodes)."""
    node_mtbf_s: float | None
    """``--node-mtbf``."""
    job_loss_mtbf_s: float | None
    """``--job-loss-mtbf``."""
    durable_share: float
    """``--durable-share``."""
    local_every_s: float | None
    """``--local-every`` in seconds of compute."""
    durable_every: int | None
    """``--durable-every``."""


MAX_REPLICAS = 1000
"""Partner copies per node: beyond this the local level is a second durable tier, not a cache."""
MAX_RANKS_PER_NODE = 10_000
MAX_DURABLE_EVERY = 10**6
MIN_DURABLE_SHARE = 1e-6
"""A smaller share of the store's time leaves no schedule: the durable interval would outlast any job."""


def level_args(args: argparse.Namespace, *, step_time_s: float | None) -> LevelArgs:
    """Every two-level flag checked, whether or not a local level is given."""
    replicas = int_flag(args.replicas, "--replicas", low=0, high=MAX_REPLICAS)
    ranks_per_node = int_flag(args.ranks_per_node, "--ranks-per-node", low=1, high=MAX_RANKS_PER_NODE)
    collective = size_flag(args.collective_bytes, "--collective-bytes", zero=True) if args.collective_bytes else 0.0
    network = Network(bytes_per_s=_rate(args.network_bandwidth, "--network-bandwidth") or DEFAULT_NETWORK_BYTES_PER_S,
                      ranks_per_node=ranks_per_node, collective_bytes_per_step=collective)
    local = None
    if args.local_bandwidth:
        local = LocalLevel(
            bytes_per_s=rate_flag(args.local_bandwidth, "--local-bandwidth"),
            read_bytes_per_s=_rate(args.local_read_bandwidth, "--local-read-bandwidth"),
            network_bytes_per_s=network.bytes_per_s,
            replicas=replicas,
            ranks_per_node=ranks_per_node,
        )
    share = fraction_flag(args.durable_share, "--durable-share", low=MIN_DURABLE_SHARE)
    durable_every = int_flag(args.durable_every, "--durable-every", low=1, high=MAX_DURABLE_EVERY) \
        if args.durable_every else None
    local_every = interval_flag(args.local_every, "--local-every", step_time_s=step_time_s) if args.local_every \
        else None
    return LevelArgs(local=local, network=network, ranks_per_node=ranks_per_node,
                     node_mtbf_s=_mtbf(args.node_mtbf, "--node-mtbf"),
                     job_loss_mtbf_s=_mtbf(args.job_loss_mtbf, "--job-loss-mtbf"), durable_share=share,
                     local_every_s=local_every, durable_every=durable_every)


def _mtbf(text: str | None, flag: str) -> float | None:
    if not text:
        return None
    value = parse_duration(text, what=flag)
    if not value > 0:
        raise ConfigError(f"{flag} must be a positive duration, got {quoted(text)}")
    return duration_flag(text, flag, low=MIN_MTBF_S)


def _rate(text: str | None, flag: str) -> float | None:
    return rate_flag(text, flag) if text else None
