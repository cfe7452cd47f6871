"""The shape of a lab: its configuration, its nodes, and the view of a running lab that job launchers use.

Kept apart from :mod:`ckptio.testing.cluster.lab` so the launchers (:mod:`ckptio.testing.cluster.jobs`) can name
a lab's parts without importing the lab that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ckptio.testing.cluster.objstore import S3Endpoint
from ckptio.testing.cluster.resources import Resources


@dataclass(frozen=True)
class LabConfig:
    """The shape of a lab. Rates are per link and per direction, in Mbit/s."""

    nodes: int = 4
    node_mbit: float = 400.0
    store_mbit: float = 800.0
    pfs: str = "moosefs"  # "moosefs", "glusterfs" or "none"
    s3: str = "auto"  # "seaweedfs", "moto", "auto" (SeaweedFS where installed, else moto) or "none"
    subnet: str = "10.200.0"  # a /24 that exists only inside the lab's namespaces
    base: Path | None = None
    mount_options: tuple[str, ...] = ()
    s3_via_node: int = 0  # the node whose link the host's S3 forwarder crosses


@dataclass
class LabNode:
    index: int
    ns: str
    address: str
    port: str  # its bridge port, in the fabric namespace
    mount: Path
    local: Path

    @property
    def name(self) -> str:
        return f"node{self.index}"


class LabView(Protocol):
    """What a launcher needs of a running lab (:class:`ckptio.testing.cluster.Lab` is one)."""

    dir: Path
    pfs_path: Path
    local_path: Path
    res: Resources
    nodes: list[LabNode]
    s3: S3Endpoint | None

    def next_port(self) -> int: ...
