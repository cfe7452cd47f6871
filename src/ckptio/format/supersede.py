"""A step saved again, without a crash window: the record of a supersede in progress, and how readers resolve it.

A step is committed iff ``manifest.json`` exists, and its manifest pairs with the ``.metadata`` beside it (the
manifest records ``.metadata``'s checksum). Superseding a committed step must replace both, and no store replaces
two objects at once. So the committer (``engine.writer.step_committer``, under the step's commit lock) does:

1. write ``supersede.json``: the old manifest and the new one (every file of the new save is already durable, and
   every rank's index of it present);
2. replace ``.metadata`` with the new save's;
3. replace ``manifest.json`` with the new manifest (compare-and-swap on the old one's etag);
4. delete ``supersede.json``, then the old save's data files.

At every instant ``manifest.json`` exists (the step stays committed for every reader, ``committed_steps`` and
``restore(step=N)`` included), and :func:`resolve` — which ``read_manifest`` applies whenever ``supersede.json``
exists — returns the one of the old and the new manifests that pairs with the ``.metadata`` in place. A kill -9
anywhere therefore leaves step N restorable, in the old state or in the new one, never neither. The next
committer of the root finishes an interrupted supersede (:func:`pending_supersede`, ``rollback.finish_supersede``).
This module reads and writes records only; it never deletes a data file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ckptio.errors import NotFoundError, StorageError
from ckptio.format.keys import METADATA, step_dir, supersede_key
from ckptio.format.records import checksum
from ckptio.storage.base import ReadStore, Storage, join_key

SUPERSEDE_FORMAT = "ckptio-supersede/1"


@dataclass(frozen=True, slots=True)
class PendingSupersede:
    """The two manifests of a supersede in progress, as written (``old`` None: the old one was unreadable)."""

    old: bytes | None
    new: bytes

    def to_json(self) -> bytes:
        body = {"format": SUPERSEDE_FORMAT, "old": None if self.old is None else self.old.decode(),
                "new": self.new.decode()}
        return json.dumps(body).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> PendingSupersede | None:
        """The record, or None when it is not one (a reader then keeps ``manifest.json`` as it is)."""
        try:
            body = json.loads(raw)
            if body.get("format") != SUPERSEDE_FORMAT or not isinstance(body.get("new"), str):
                return None
            old = body.get("old")
            return cls(old=old.encode() if isinstance(old, str) else None, new=body["new"].encode())
        except (ValueError, AttributeError, UnicodeError):
            return None


def write_pending(storage: Storage, step: int, pending: PendingSupersede) -> None:
    storage.put(supersede_key(step), pending.to_json())


def pending_supersede(storage: ReadStore, step: int) -> PendingSupersede | None:
    """The supersede of ``step`` in progress (or interrupted), or None."""
    try:
        raw = storage.get(supersede_key(step))
    except NotFoundError:
        return None
    return PendingSupersede.from_json(raw)


def resolve(storage: ReadStore, step: int, current: bytes, pending: PendingSupersede) -> bytes:
    """Of ``manifest.json``'s bytes ``current`` and the pending record's two manifests, the one whose
    ``metadata_crc32c`` matches the ``.metadata`` in place (``current`` when none can tell)."""
    try:
        crc = checksum([storage.get(join_key(step_dir(step), METADATA))])
    except StorageError:
        return current
    for raw in (current, pending.new, pending.old):
        if raw is not None and _metadata_crc(raw) == crc:
            return raw
    return current


def _metadata_crc(raw: bytes) -> str | None:
    try:
        value = json.loads(raw).get("metadata_crc32c")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
