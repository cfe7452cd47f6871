"""What one restore works with, as values: the stores it reads, the group it runs on, how it reads and what it
trusts, and (two levels) where the local level's copies are.

A restore is built from one :class:`RestoreContext` rather than from long keyword lists: the step chooser, the
readers and the two-level restore each take the context and read what they need from it, so a new setting is added
in one place and reaches every path. ``CkptioStorageReader``'s public constructor stays the keyword form DCP users
call; ckptio's own paths build readers from a context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptio.engine.protocol import Peer
from ckptio.engine.restore.read_plan import CHUNK_BYTES
from ckptio.engine.side_group import SideGroup
from ckptio.errors import ConfigError
from ckptio.storage.base import Storage

READY_TIMEOUT_S = 60.0
"""How long ranks wait for one another at the readiness gate (:mod:`ckptio.engine.restore.readiness`), from the
first to the last arrival: reading a manifest and ``.metadata`` takes far less on any store ckptio supports, and a
rank that raised comes at once; only a rank that died or is stuck makes the others wait this long."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOptions:
    """How a restore reads: its concurrency, its task size, whether ranks share ranges, and what it trusts."""

    concurrency: int = 4
    """Requests in flight per rank (reads, and receives from other ranks); each non-direct one holds a bounce
    buffer of ``chunk_bytes``, so a restore holds at most ``concurrency × chunk_bytes`` beyond its targets (and,
    after a node loss, a rank a lost file is pushed to or from holds as much again until it has landed:
    :mod:`~ckptio.engine.restore.early_push`)."""
    chunk_bytes: int = CHUNK_BYTES
    """Largest task, and the size of each bounce buffer."""
    exchange: bool = True
    """Share ranges several ranks need (read once, sent over the process group); False: each rank reads all it
    needs itself."""
    trust_pickles: bool = False
    """Unpickle ``.metadata`` and values without the allowlist (the explicit opt-in of docs/security.md)."""
    safe_globals: tuple[Any, ...] = ()
    """Classes and functions a value's pickle may name beyond the allowlist."""
    extension_registry: Any = None
    """DCP's ``ExtensionRegistry`` whose classes decode items stored through stream extensions (None: DCP's
    default, which holds ZStandard)."""
    ready_timeout_s: float = READY_TIMEOUT_S
    """The readiness gate's bound (:data:`READY_TIMEOUT_S`)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.chunk_bytes < 1 or not 0 < self.ready_timeout_s < 86400:
            raise ConfigError(f"restore needs concurrency ≥ 1, chunk_bytes ≥ 1 and 0 < ready_timeout_s < 1 day, got "
                              f"{self.concurrency}, {self.chunk_bytes}, {self.ready_timeout_s}")
        object.__setattr__(self, "safe_globals", tuple(self.safe_globals))

    @classmethod
    def of(cls, *, concurrency: int, trust_pickles: bool, safe_globals: Sequence[Any]) -> ReadOptions:
        """The options a Checkpointer's config gives (its ``upload_concurrency`` is the restore's too)."""
        return cls(concurrency=concurrency, trust_pickles=trust_pickles, safe_globals=tuple(safe_globals))


@dataclass(frozen=True, slots=True)
class LocalLevel:
    """The local level a two-level restore reads besides the durable root: its records, this rank's node, and every
    rank's partner server with the secret that authenticates it."""

    records: Storage
    """The local level's manifests, ``.metadata`` and rank indexes (a prefix of the durable root)."""
    node: str
    peers: tuple[Peer, ...]
    secret: bytes = field(repr=False)
    timeout_s: float
    """Deadline of one fetch from a partner server."""


@dataclass(frozen=True, slots=True)
class RestoreContext:
    """One restore's stores, group and settings, shared by every rank's step choice, reader and exchange."""

    durable: Storage
    """The durable root (steps are chosen by listing it; data is read through its read side)."""
    group: SideGroup
    """The side group every collective of the restore runs on."""
    local: Storage | None = None
    """This node's ``local_dir`` (the local tier's copies, preferred when intact), or None."""
    options: ReadOptions = field(default_factory=ReadOptions)
    level: LocalLevel | None = None
    """The local level of a two-level job, or None."""

    @property
    def process_group(self) -> Any:
        """What ``dcp.load`` and the exchange run on (None when running as one process)."""
        return self.group.group if self.group.distributed else None
