"""What a save's and a commit's metadata work costs on a store: the engine's own operation count, timed at the
probed rate of each kind.

Owns the map from the storage protocol's operations (``put``, ``get``, ``head``, ``list``, ``delete``, counted by
:func:`ckptio.format.commit_ops.commit_ops`, the count tests/engine/writer/test_commit_ops.py holds the writer to)
onto the probe's metadata kinds (``create``, ``stat``, ``rename``, ``list``, ``fsync``, ``unlink``: the profile's
``metadata`` keys, :mod:`ckptio.plan.measure.probe_metadata`), and the seconds that work takes. It must never
touch storage nor decide whether the time is acceptable (the budget does).

What one storage operation costs in metadata kinds (:data:`POSIX_OPS`, :data:`OBJECT_OPS`):

* POSIX ``put`` (``PosixStorage._commit``): a stat of the directory, an ``O_EXCL`` create of a temp file, its fsync,
  a stat of the temp file (its etag), the publish (``rename``, or ``link`` for create-only: both a name operation in
  the directory, counted as ``rename``), the directory's fsync, and the temp name's removal (an unlink: a real one
  after ``link``, a failed lookup after ``rename``, counted as an unlink either way so the figure never runs low).
  Without fsync (``PosixStorage(fsync=False)``) the two fsyncs go.
* POSIX ``get``/``head``: one lookup (``stat``); ``list``: one directory read (``list``); ``delete``: ``unlink``.
* Object store: ``put`` is one ``create`` (a PUT; parts of a large upload are the request model's, not this one's),
  ``get``/``head`` a ``stat`` (GET/HEAD), ``list`` a ``list``, ``delete`` an ``unlink``.

The timing rule: the probed rates are the store's aggregate (the probe's writers at once), so however many ranks
issue a save's operations in parallel, they finish no sooner than the total of each kind ÷ that kind's rate; the
kinds add up, because the store serves them from the same metadata service. Rank 0's committer issues the commit's
operations one after another from one client, and is timed at the same aggregate rates: a lower bound on its time,
so a refusal on it is certain, never a guess. A kind with no probed rate takes the single ``metadata_ops_per_s``
(``--metadata-ops``, or an old profile's), else the built-in default of the store kind. A time from a default is
reported but refuses nothing (the budget warns instead): the default is one local disk's order, and a job planned
by bandwidth alone may well run on a parallel filesystem whose metadata service is many times faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ckptio.format.commit_ops import CommitOps, CommitShape, commit_ops
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointShape

MetadataCost = dict[str, int]
"""Metadata operations of one storage operation, by kind (``create``, ``stat``, …)."""

POSIX_OPS: dict[str, MetadataCost] = {
    "put": {"stat": 2, "create": 1, "fsync": 2, "rename": 1, "unlink": 1},
    "get": {"stat": 1},
    "head": {"stat": 1},
    "list": {"list": 1},
    "delete": {"unlink": 1},
}
"""What each storage operation costs on a POSIX store with fsync on (the module docstring says why)."""

POSIX_OPS_NO_FSYNC: dict[str, MetadataCost] = {
    **POSIX_OPS, "put": {k: v for k, v in POSIX_OPS["put"].items() if k != "fsync"}
}
"""The same, for ``PosixStorage(fsync=False)``."""

OBJECT_OPS: dict[str, MetadataCost] = {
    "put": {"create": 1},
    "get": {"stat": 1},
    "head": {"stat": 1},
    "list": {"list": 1},
    "delete": {"unlink": 1},
}
"""What each storage operation costs on an object store: one request each."""

DEFAULT_POSIX_RATES: dict[str, float] = {
    "create": 2000.0, "stat": 20000.0, "rename": 20000.0, "list": 8000.0, "fsync": 2000.0, "unlink": 3000.0,
}
"""Operations per second per kind when nothing was probed on a POSIX store: round figures at or below what the
probe measures on one local ext4 disk (docs/planning.md), so a plan without a profile errs toward a slow store."""

S3_GET_RATE_PER_PREFIX = 5500.0
"""GET/HEAD requests per second per partitioned prefix (AWS S3 documentation); listings are counted with them."""


@dataclass(kw_only=True, slots=True, frozen=True)
class CommitMetadata:
    """The metadata work of one steady-state save and commit of a job, and what it takes on the store."""

    ops: CommitOps
    """Storage operations by kind (:func:`~ckptio.format.commit_ops.commit_ops` for the job's shape)."""
    save_s: float
    """Seconds of metadata work of one save, every rank's writer together, at the store's aggregate rates."""
    commit_s: float
    """Seconds of metadata work of the commit (rank 0's committer)."""
    rates: dict[str, float] = field(default_factory=dict)
    """Operations per second used per metadata kind."""
    rates_source: str = "default"
    """``probed`` (per-kind rates of a profile), ``given`` (one rate for every kind) or ``default``."""

    @property
    def measured(self) -> bool:
        """Every rate came from the store (probed or given): only then may the time refuse a job."""
        return self.rates_source != "default"

    @property
    def total_s(self) -> float:
        """Save plus commit: what must fit in the save interval."""
        return self.save_s + self.commit_s

    def to_json(self) -> dict[str, Any]:
        """The plan's keys: ``metadata_ops`` (by storage operation) and ``commit_metadata_s``."""
        return {
            "metadata_ops": {"per_save": dict(self.ops.per_save), "per_commit": dict(self.ops.per_commit)},
            "commit_metadata_s": self.total_s,
            "commit_metadata": {"save_s": self.save_s, "commit_s": self.commit_s, "rates": dict(self.rates),
                                "rates_source": self.rates_source},
        }


def commit_shape(shape: CheckpointShape, *, keep_last: int, verify: bool = False) -> CommitShape:
    """The commit's shape of a checkpoint of ``shape``: every rank, and the data files of the job spread evenly
    over them, rounded up (rank classes differ in files; :func:`commit_ops` counts ``world × files``, so the mean
    keeps the job's total within ``ranks - 1`` files of the truth where the largest rank's count would multiply
    the few ranks that write much)."""
    files = sum(c.count * c.files for c in shape.classes)
    return CommitShape(world_size=shape.ranks, files_per_rank=math.ceil(files / max(shape.ranks, 1)),
                       keep_last=keep_last, level="durable", verify=verify)


def commit_metadata(shape: CommitShape, storage: StoreLimits, *, fsync: bool = True) -> CommitMetadata:
    """The operations of one save and commit of ``shape`` and their seconds on ``storage``."""
    ops = commit_ops(shape)
    table = OBJECT_OPS if storage.kind == "object" else (POSIX_OPS if fsync else POSIX_OPS_NO_FSYNC)
    save, commit = _kinds(ops.per_save, table), _kinds(ops.per_commit, table)
    rates, source = metadata_rates(storage, set(save) | set(commit))
    return CommitMetadata(ops=ops, save_s=_seconds(save, rates), commit_s=_seconds(commit, rates),
                          rates=rates, rates_source=source)


def metadata_rates(storage: StoreLimits, kinds: set[str]) -> tuple[dict[str, float], str]:
    """Operations per second of each of ``kinds`` on ``storage`` (probed, else the one given rate, else the
    default), and where they came from (the least measured source used)."""
    defaults = _object_rates(storage) if storage.kind == "object" else DEFAULT_POSIX_RATES
    rates: dict[str, float] = {}
    sources: set[str] = set()
    for kind in sorted(kinds):
        if storage.metadata_rates.get(kind):
            rates[kind], source = storage.metadata_rates[kind], "probed"
        elif storage.metadata_ops_per_s:
            rates[kind], source = storage.metadata_ops_per_s, "given"
        else:
            rates[kind], source = defaults[kind], "default"
        sources.add(source)
    least = next((s for s in ("default", "given", "probed") if s in sources), "default")
    return rates, least


def _object_rates(storage: StoreLimits) -> dict[str, float]:
    writes = storage.put_rate_per_prefix * storage.prefixes
    reads = S3_GET_RATE_PER_PREFIX * storage.prefixes
    return {"create": writes, "unlink": writes, "stat": reads, "list": reads}


def _kinds(storage_ops: dict[str, int], table: dict[str, MetadataCost]) -> dict[str, int]:
    """Storage operations by protocol kind → metadata operations by probed kind."""
    out: dict[str, int] = {}
    for op, count in storage_ops.items():
        for kind, each in table[op].items():
            out[kind] = out.get(kind, 0) + count * each
    return out


def _seconds(ops: dict[str, int], rates: dict[str, float]) -> float:
    return sum(count / rates[kind] for kind, count in ops.items())
