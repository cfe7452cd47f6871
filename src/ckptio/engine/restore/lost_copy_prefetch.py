"""A replaced node's files fetched back from their partner copies while the Checkpointer is still being built.

After a node is lost, the node that takes its place starts with an empty local dir: its ranks' files of the newest
local-level step survive only as partner copies on other nodes. Left to the restore, they cross the fabric during
DCP's load, after rank 0's choice, the holdings report and the readiness gate, each a round trip on a store and a
fabric busy with the whole job starting again. Begun as soon as the partner addresses are known, while every rank
still builds its side group and boots its writer, the fetch is done, or nearly, when the restore begins; the restore
waits for it before nodes report what they hold, so this node then holds those files and reads them from its own
disk, and no rank has to send them.

Rules:

* Only a node whose local dir holds no step at all (a replaced or new node; a node that kept its disk holds its own
  copies) and only its lowest rank fetch: one fetch per node.
* Only the newest committed local-level step, only the files this node wrote (their record's first holder), only
  from the nodes the record names, each copy checked against the digest in the records on the durable root before
  it is kept, as every copy fetched from a peer is (:func:`fetch_from_holders`).
* It is a head start, never a source of truth: any failure is logged and leaves the restore to fetch as it would
  have, and a restore that chooses another step ignores what was fetched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptio import format as fmt
from ckptio.engine.partner import fetch_verified
from ckptio.engine.restore.context import LocalLevel
from ckptio.errors import ChecksumError, CkptError
from ckptio.format import FileRecord
from ckptio.format.local_level_records import PARTNERS_DIR, own_copy_key, partner_copy_key
from ckptio.storage.base import Storage

__all__ = ["LostCopyPrefetch", "Prefetched", "fetch_from_holders"]

log = logging.getLogger("ckptio")


def fetch_from_holders(level: LocalLevel, step: int, record: FileRecord, dest_path: str, *,
                       holders: list[str]) -> None:
    """Fetch ``record``'s file of ``step`` into ``dest_path`` from the first of ``holders`` (nodes other than this
    one) whose partner server gives a copy of the recorded size and digest; ChecksumError when none does. A record
    without a digest is never fetched: nothing could vouch for bytes that crossed the network."""
    if not record.digest:
        raise ChecksumError(f"{record.name}: no partner digest recorded: copies on other nodes are not used",
                            root=level.records.url, step=step, path=record.name)
    for node in holders:
        if node == level.node:
            continue
        for peer in level.peers:
            if peer.node != node:
                continue
            try:  # streamed into place only when its size and digest match the record
                fetch_verified(peer.host, peer.port, step, record.name, dest_path, expected_digest=record.digest,
                               expected_size=record.size, secret=level.secret, timeout_s=level.timeout_s)
                return
            except (OSError, CkptError) as exc:
                log.warning("ckptio: %s from node %r (%s:%s) unusable: %s", record.name, node, peer.host, peer.port,
                            exc)
    raise ChecksumError(f"{record.name}: no intact copy on any other node of the local level",
                        root=level.records.url, step=step, path=record.name)


@dataclass(frozen=True, slots=True)
class Prefetched:
    """What a prefetch left in this node's partner area: ``names`` of local-level step ``step``, each verified
    against its recorded digest as it arrived."""

    step: int | None = None
    names: frozenset[str] = field(default_factory=frozenset)


class LostCopyPrefetch:
    """The background fetch of this node's files of the newest local-level step (module docstring: when it runs)."""

    def __init__(self, level: LocalLevel, local: Storage, local_file: Callable[[str], str]) -> None:
        """``local``: this node's local dir; ``local_file(key)``: the path of ``key`` in it."""
        self.level, self.local, self._local_file = level, local, local_file
        self._result = Prefetched()
        self._thread = threading.Thread(target=self._run, name="ckptio-lost-copy-prefetch", daemon=True)

    @classmethod
    def start_if_replaced(cls, level: LocalLevel, local: Storage, rank: int) -> LostCopyPrefetch | None:
        """Start the fetch on the lowest rank of a node whose local dir holds no step; None elsewhere."""
        directory = local.local_directory()
        if directory is None or rank != min(p.rank for p in level.peers if p.node == level.node):
            return None
        try:
            names = (*local.list_dirs(""), *local.list_dirs(PARTNERS_DIR))
            if any(fmt.parse_step_dir(name) is not None for name in names):
                return None  # this node kept its disk: it holds what it wrote
        except CkptError:
            return None
        prefetch = cls(level, local, directory.local_path)
        prefetch._thread.start()
        return prefetch

    def wait(self, timeout_s: float) -> Prefetched:
        """What was fetched, once the fetch ended or ``timeout_s`` passed (then the files whole by then; the
        restore fetches the others itself)."""
        self._thread.join(timeout_s)
        return self._result

    def _run(self) -> None:
        try:
            step = fmt.newest_committed_step(self.level.records)
            if step is None:
                return
            manifest = fmt.read_manifest(self.level.records, step)
        except Exception as exc:  # a head start only: the restore chooses and reads the records itself
            log.warning("ckptio: the local level's records unreadable; the restore will fetch this node's files: %s",
                        exc)
            return
        fetched: set[str] = set()
        for name, record in sorted(manifest.files.items()):
            if not record.holders or record.holders[0] != self.level.node:
                continue  # another node wrote it: that node, or the restore, brings it back
            try:
                if self.local.exists(own_copy_key(step, name)) or self.local.exists(partner_copy_key(step, name)):
                    continue
                fetch_from_holders(self.level, step, record, self._local_file(partner_copy_key(step, name)),
                                   holders=record.holders[1:])
            except Exception as exc:  # the restore fetches it, or reads the durable level
                log.warning("ckptio: %s not fetched back ahead of the restore: %s", name, exc)
                continue
            fetched.add(name)
            self._result = Prefetched(step, frozenset(fetched))
