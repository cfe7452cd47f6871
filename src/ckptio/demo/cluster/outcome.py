"""The cluster demo's values: what it is told (:class:`ClusterConfig`) and what it found (:class:`ClusterOutcome`),
apart from the runner so the tables and the bench read them without the runner."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptio.demo.cluster import planner
from ckptio.demo.cluster.cpu import SaveCpu
from ckptio.demo.cluster.figures import PacingFigures, RecoveryFigures, TrainFigures
from ckptio.errors import ConfigError
from ckptio.testing.cluster import LabConfig


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """What ``ckptio demo --cluster`` runs."""

    nodes: int = 4
    """Node namespaces of the lab (each with its own shaped link)."""
    ranks_per_node: int = 1
    """Ranks on every node (1 or 2: the machine's cores run every rank, writer and loader)."""
    node_mbit: float = 400.0
    """Each node's link, Mbit/s per direction."""
    store_mbit: float = 800.0
    """The storage namespace's link, Mbit/s per direction: the parallel FS and S3 share it."""
    state_mib: float = 16.0
    """Checkpointed bytes per rank (weights and two Adam moments)."""
    grad_mib: float = 2.0
    """The gradient all-reduced across the nodes every step."""
    every: int = 10
    """Save every this many steps."""
    saves: int = 4
    """Saves per run (after an untimed first one). Even, so that the newest save is on the local level only and a
    node loss restores from the local level and the partner copy (with ``durable_every`` 2)."""
    calm_steps: int = 12
    """Steps before any save: the clean step, the calm all-reduce and loader rates."""
    durable_every: int = 2
    """ckptio's two levels: every save local with a partner copy, every k-th durable."""
    paced_run: bool = True
    """Also run ckptio paced on the parallel FS (the fabric's figure: the all-reduce beside paced copies)."""
    pace_share: float = 0.25
    """The paced run's ``partner_pace`` and ``flush_pace``: this share of a node's link, so the all-reduce keeps
    the rest of it while copies and flushes cross it (the paced run's interval is stretched until a save's copies
    and flush fit in it at that pace: a save that finds the last one still going hurries it to full speed)."""
    stores: tuple[str, ...] = ("pfs", "s3")
    """Where ckptio runs (DCP-best runs on the parallel FS)."""
    out: Path = field(default_factory=lambda: Path("ckptio-demo-cluster"))
    """Where the probes' profiles go."""

    lost_node: int = 1
    """The node lost for real (never node 0: the job's rendezvous is there)."""

    def __post_init__(self) -> None:
        if not 0 < self.lost_node < self.nodes:
            raise ConfigError(f"the lost node must be one of 1..{self.nodes - 1}, got {self.lost_node}")
        if self.nodes < 2:
            raise ConfigError(f"--nodes must be >= 2 (one is lost), got {self.nodes}")
        if self.ranks_per_node not in (1, 2):
            raise ConfigError(f"--ranks-per-node must be 1 or 2, got {self.ranks_per_node}")
        if self.saves < 2 or self.every < 2 or self.durable_every < 2:
            raise ConfigError("need saves >= 2, every >= 2 and durable_every >= 2")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    def lab(self) -> LabConfig:
        return LabConfig(nodes=self.nodes, node_mbit=self.node_mbit, store_mbit=self.store_mbit)


    @property
    def pace_bytes_per_s(self) -> float:
        return self.pace_share * self.node_mbit * 1e6 / 8

    def paced_every(self, step_s: float) -> int:
        """The paced run's interval in steps of ``step_s``: a durable save's partner copy and flush (this node's
        ranks' bytes, twice) at the pace, with a quarter to spare, and never shorter than ``every``."""
        seconds = 2 * self.ranks_per_node * self.state_mib * 2**20 / self.pace_bytes_per_s
        return max(self.every, math.ceil(1.25 * seconds / max(step_s, 1e-3)))


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """One run: its figures, the planner's prediction, and the recovery when a node was lost."""

    name: str
    saver: str
    store: str
    figures: TrainFigures
    plan: dict[str, Any]
    recovery: RecoveryFigures | None = None
    pacing: PacingFigures | None = None
    every: int = 0
    """The run's interval in steps (the paced run's is stretched: ``ClusterConfig.paced_every``)."""
    cpu: SaveCpu | None = None


@dataclass
class ClusterOutcome:
    config: ClusterConfig
    runs: list[RunOutcome]
    stores: dict[str, planner.StoreFigures]
    wall_s: float = 0.0

    def run(self, name: str) -> RunOutcome | None:
        return next((r for r in self.runs if r.name == name), None)
