"""How many storage operations a save and its commit cost, by kind, from the job's shape alone.

The writer's commit path is built so that this count depends on the job's shape — world size, data files per rank,
``keep_last``, the level — and never on what the root already holds (``format.retention``'s cost rule): the
planner multiplies it out for any job (``plan``), and tests/engine/writer/test_commit_ops.py holds the engine to
these exact numbers with a counting storage (``ckptio.testing.wrappers.OpCountingStorage``) on roots holding 1 and
100 steps. Kinds are the storage protocol's operations: ``put`` (an object created or replaced, uploads
included), ``get``, ``head``, ``list`` (one listing of one step's directory), ``delete``.

The count is of the steady state: the root holds at least ``keep_last`` committed steps (so each commit retires
one, of the same shape), the first poll of rank 0's committer finds every rank's index, and no supersede, rollback
or failure happens. Each further poll of a waiting committer or watcher costs one ``list`` (for failure markers)
and one ``list`` or ``get``; the leftover sweep (start, close, after a failure) lists the root once.
This module is arithmetic: it never touches storage.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

KINDS = ("put", "get", "head", "list", "delete")


@dataclass(frozen=True, slots=True)
class CommitShape:
    """What a save's and a commit's operations depend on."""

    world_size: int
    files_per_rank: int
    keep_last: int
    """The level's retention (0: keep all; the local level keeps 1)."""
    level: Literal["durable", "local"] = "durable"
    """``local``: the data stays on the nodes; only the records are on the root (under ``levels/local/``)."""
    verify: bool = False
    """``commit="lease"``: the manifest is read back after it is written."""


@dataclass(frozen=True, slots=True)
class CommitOps:
    """Operations on the root of one save (every rank's writer) and of its commit (rank 0's committer)."""

    per_save: dict[str, int] = field(default_factory=dict)
    per_commit: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> dict[str, int]:
        return {kind: self.per_save.get(kind, 0) + self.per_commit.get(kind, 0) for kind in KINDS}


def commit_ops(shape: CommitShape) -> CommitOps:
    """The operations of one steady-state save and commit of a job of ``shape``, by kind."""
    world, files = shape.world_size, shape.files_per_rank
    root_files = world * files if shape.level == "durable" else 0  # local-level data lives on node disks
    save = Counter(put=root_files + world,  # each rank's data files, then its index
                   get=world - 1)  # each other rank's watcher finds the manifest at its first poll
    commit = Counter(
        list=1, get=world,  # rank 0 gathers the step's rank indexes: one listing, one read each
        put=4,  # the step's commit lock (create-only), .metadata, the manifest (create-only), latest
        head=2,  # is the step committed already (a supersede)? and latest's etag for its compare-and-swap
        delete=1,  # the commit lock
    )
    commit["list"] += 1  # the step's own directory, for data files of an earlier attempt at it
    commit["get"] += 1 + shape.verify  # latest's value; the manifest read back (lease mode)
    if shape.keep_last > 0:
        commit += Counter(
            get=2 + 1,  # the retired step's manifest and its (absent) pending supersede; retired.json
            delete=1 + root_files + world + 1,  # its manifest, data files, rank indexes and .metadata
            list=1,  # its directory, for ckptio's own keys left in it (never a key of anyone else)
            put=1,  # retired.json, which lagging watchers read
        )
    return CommitOps(per_save=_by_kind(save), per_commit=_by_kind(commit))


def _by_kind(counts: Counter[str]) -> dict[str, int]:
    return {kind: counts[kind] for kind in KINDS if counts[kind]}
