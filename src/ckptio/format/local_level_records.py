"""The local level's records on the durable root, and where its data lies on a node.

A two-level job keeps frequent node-local saves (the local level) beside rare durable ones. The local level's data
lives on node-local disks: each rank's own files in its ``local_dir`` under ``step-XXXXXXXX/<name>``, and the copies
a node keeps for partner ranks under ``partners/step-XXXXXXXX/<name>``. Its *records* live on the durable root, so
that they survive the loss of any node, laid out exactly like the durable level's records, one directory down::

    <root>/levels/local/
        step-XXXXXXXX/ranks/<rank>.json   a rank's index; each file record names the nodes holding the file
                                          (``holders``) and its cryptographic ``digest``
        step-XXXXXXXX/.metadata           the DCP metadata of the step
        step-XXXXXXXX/manifest.json       written last, create-only: the local level's commit
        latest, retired.json              as on the durable level

:func:`local_records` is that subtree as a storage of its own, so the durable level's commit protocol, retention,
rollback and verification serve the local level unchanged. A local-level step is committed iff its manifest exists;
it is restorable iff, in addition, every file is intact on some node (or the same save is committed on the durable
level too). ``levels/`` is not a step directory, so nothing of the durable level mistakes it for one.

Records written before this layout (formats ``ckptio-local-index/1`` and ``ckptio-local-manifest/1``) do not parse
as records: such a step counts as unreadable and a restore takes the durable level. No processes and no
collectives here; never imports the engine.
"""

from __future__ import annotations

from typing import Any

from ckptio.errors import CheckpointNotFoundError, CorruptCheckpointError, StorageError
from ckptio.format.commit import committed_steps, read_manifest
from ckptio.format.keys import step_dir
from ckptio.format.records import Manifest
from ckptio.storage.base import Storage, join_key
from ckptio.storage.subtree import SubtreeStorage

LEVELS_LOCAL = "levels/local"
PARTNERS_DIR = "partners"


def local_records(durable: Storage) -> Storage:
    """The local level's records (under ``levels/local/`` of the durable root), as a root of their own."""
    return SubtreeStorage(durable, LEVELS_LOCAL)


def own_copy_key(step: int, name: str) -> str:
    """Where a rank's own file of ``step`` lies in its node's local dir."""
    return join_key(step_dir(step), name)


def partner_copy_key(step: int, name: str) -> str:
    """Where a partner's file of ``step`` lies in this node's local dir."""
    return join_key(PARTNERS_DIR, step_dir(step), name)


def holder_nodes(manifest: Manifest) -> list[str]:
    """Every node holding some file of a local-level step, sorted."""
    return sorted({node for rec in manifest.files.values() for node in rec.holders})


def level_rows(durable: Storage) -> dict[int, dict[str, Any]]:
    """Per committed local-level step: where it is held (for ``ckptio ls``). Corrupt records are reported."""
    records = local_records(durable)
    rows: dict[int, dict[str, Any]] = {}
    for step in committed_steps(records):
        try:
            manifest = read_manifest(records, step)
        except (CorruptCheckpointError, CheckpointNotFoundError, StorageError) as exc:
            rows[step] = {"corrupt": str(exc)}
            continue
        rows[step] = {"nodes": holder_nodes(manifest), "world_size": manifest.world_size,
                      "bytes": manifest.total_bytes, "files": len(manifest.files),
                      "durable_too": _same_save_durable(durable, manifest)}
    return rows


def _same_save_durable(durable: Storage, manifest: Manifest) -> bool:
    try:
        return read_manifest(durable, manifest.step).save_id == manifest.save_id
    except (CorruptCheckpointError, CheckpointNotFoundError, StorageError):
        return False


def merge_level_rows(rows: list[dict[str, Any]], local: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """``ckptio ls``: each row's ``levels`` are the levels whose manifest exists for its step (``durable``, then
    ``local``), the levels ``verify`` checks it on; ``committed`` is true when there is one. ``held_on`` says where
    its data is: the root, then nodes. A local manifest that fails its checks still commits the step on that level
    (as a durable one does), with ``corrupt`` saying why; local-only steps get rows of their own."""
    by_step = {r["step"]: r for r in rows}
    for row in rows:
        row["levels"] = ["durable"] if row["committed"] else []
        row["held_on"] = ["durable root"] if row["committed"] else []
    for step, info in local.items():
        row = by_step.setdefault(step, {"step": step, "latest": False, "levels": [], "held_on": []})
        row["committed"] = True
        for key, value in info.items():  # sizes from the durable manifest when there is one, else the local one
            if key not in ("nodes", "durable_too", "corrupt"):
                row.setdefault(key, value)
        row["levels"].append("local")
        row["held_on"].extend(f"node {n}" for n in info.get("nodes", []))
        if "corrupt" in info:
            row.setdefault("corrupt", f"local level: {info['corrupt']}")
    return [by_step[s] for s in sorted(by_step)]
