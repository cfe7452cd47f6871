"""The local level's records on the durable root: which node holds which shard of a node-local step (issue 10).

A local-level step's *data* lives on node-local disks (each rank's own ``local_dir`` plus ``replicas`` partner
nodes' partner areas); only its small records live on the durable root, so that they survive any node::

    <root>/levels/local/step-XXXXXXXX/
        ranks/<rank>.json   a rank's index (files, sizes, checksums) and the nodes holding its files
        .metadata           the DCP metadata of this step (as for a durable step)
        manifest.json       written last, create-only: the local level's commit, with ``holders`` per file

A local-level step is committed iff its ``manifest.json`` exists; it is restorable iff, in addition, every file
is intact on some node (or the same save is also committed on the durable level). ``levels/`` is not a step
directory, so durable retention, ``ls`` and ``verify`` of the durable level never mistake it for one.

On a node, partner copies land in ``<local_dir>/partners/step-XXXXXXXX/<name>`` (own files stay in
``<local_dir>/step-XXXXXXXX/``). No processes and no collectives here; never imports the engine.

``digests`` (file name → ``sha256:<hex>``, in the rank index and the manifest) authenticate copies that crossed
the network: the sender hashes each file while it streams it to a partner, and restore uses a partner copy only
when it hashes to this record (docs/security.md). Records written before digests existed parse with none; their
partner copies are then not used (a node's own copies and the durable level still are).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ckptio.errors import AlreadyExistsError, CommitError, CorruptCheckpointError, NotFoundError, StorageError
from ckptio.format.keys import MANIFEST, METADATA, RANKS_DIR, check_file_name, parse_step_dir, step_dir
from ckptio.format.records import Manifest, RankIndex
from ckptio.storage.base import Storage, join_key

LEVELS_LOCAL = "levels/local"
PARTNERS_DIR = "partners"
LOCAL_INDEX_FORMAT = "ckptio-local-index/1"
LOCAL_MANIFEST_FORMAT = "ckptio-local-manifest/1"
DIGEST_PREFIX = "sha256:"
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}\Z")


def parse_digests(value: Any, files: Any, *, step: int, path: str) -> dict[str, str]:
    """The ``digests`` field of a record (absent: ``{}``); CorruptCheckpointError unless every entry is a digest
    of a file the record lists."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) and _DIGEST_RE.match(v) for v in value.values()):
        raise CorruptCheckpointError("malformed partner digests", step=step, path=path)
    unknown = set(value) - set(files)
    if unknown:
        raise CorruptCheckpointError(f"digest of an unlisted file {sorted(unknown)[0]!r}", step=step, path=path)
    return {str(k): v for k, v in value.items()}


def local_step_key(step: int, *parts: str) -> str:
    return join_key(LEVELS_LOCAL, step_dir(step), *parts)


def local_index_key(step: int, rank: int) -> str:
    return local_step_key(step, RANKS_DIR, f"{rank}.json")


def local_metadata_key(step: int) -> str:
    return local_step_key(step, METADATA)


def local_manifest_key(step: int) -> str:
    return local_step_key(step, MANIFEST)


def local_failed_key(step: int, who: str) -> str:
    return local_step_key(step, "failed", f"{who}.json")


def own_copy_key(step: int, name: str) -> str:
    """Where a rank's own file of ``step`` lies in its node's local dir."""
    return join_key(step_dir(step), name)


def partner_copy_key(step: int, name: str) -> str:
    """Where a partner's file of ``step`` lies in this node's local dir."""
    return join_key(PARTNERS_DIR, step_dir(step), name)


@dataclass(kw_only=True, slots=True)
class LocalRankIndex:
    """One rank's part of a local-level step: its durable-style index plus the nodes holding its files."""

    index: RankIndex
    node: str
    holders: list[str]
    """Nodes holding every file of this rank, its own node first, then the partners that acknowledged a copy."""
    digests: dict[str, str] = field(default_factory=dict)
    """File name → digest of the bytes sent to partners (empty in records written before digests existed)."""

    def to_json(self) -> bytes:
        body = {"format": LOCAL_INDEX_FORMAT, "node": self.node, "holders": self.holders,
                "index": json.loads(self.index.to_json()), "digests": self.digests}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = "") -> LocalRankIndex:
        try:
            d = json.loads(raw)
            if d.get("format") != LOCAL_INDEX_FORMAT:
                raise ValueError("unknown format")
            node, holders = d["node"], d["holders"]
            if not isinstance(node, str) or not all(isinstance(h, str) for h in holders):
                raise ValueError("node names must be strings")
            index = RankIndex.from_json(json.dumps(d["index"]).encode(), key=key)
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCheckpointError(f"unreadable local rank index: {exc}", path=key) from exc
        digests = parse_digests(d.get("digests"), {f.name for f in index.files}, step=index.step, path=key)
        return cls(index=index, node=node, holders=list(holders), digests=digests)


@dataclass(kw_only=True, slots=True)
class LocalManifest:
    """The local level's commit record of one step: a durable-style manifest plus where each file is held."""

    manifest: Manifest
    holders: dict[str, list[str]]
    """File name → nodes holding a copy (the writing rank's node first)."""
    nodes: dict[int, str] = field(default_factory=dict)
    """Rank → node at save time."""
    durable: bool = False
    """This save also goes to the durable level (its files can be read from there when every node copy is lost)."""
    digests: dict[str, str] = field(default_factory=dict)
    """File name → digest a partner copy must hash to (from the rank indexes; empty in older records)."""

    @property
    def step(self) -> int:
        return self.manifest.step

    def to_json(self) -> bytes:
        body = {"format": LOCAL_MANIFEST_FORMAT, "manifest": json.loads(self.manifest.to_json()),
                "holders": self.holders, "nodes": {str(r): n for r, n in self.nodes.items()},
                "durable": self.durable, "digests": self.digests}
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = "") -> LocalManifest:
        try:
            d = json.loads(raw)
            if d.get("format") != LOCAL_MANIFEST_FORMAT:
                raise ValueError("unknown format")
            manifest = Manifest.from_json(json.dumps(d["manifest"]).encode(), key=key)
            holders = {str(k): [str(n) for n in v] for k, v in d["holders"].items()}
            nodes = {int(r): str(n) for r, n in d["nodes"].items()}
            durable = bool(d.get("durable", False))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptCheckpointError(f"unreadable local manifest: {exc}", path=key) from exc
        digests = parse_digests(d.get("digests"), manifest.files, step=manifest.step, path=key)
        for name in holders:
            check_file_name(name, step=manifest.step, path=key)
        if set(holders) != set(manifest.files):
            raise CorruptCheckpointError("local manifest: holders and files disagree", step=manifest.step, path=key)
        return cls(manifest=manifest, holders=holders, nodes=nodes, durable=durable, digests=digests)


def write_local_manifest(storage: Storage, manifest: LocalManifest) -> None:
    """Create-only: the local level's commit point (a retry that finds its own save's manifest is fine)."""
    key = local_manifest_key(manifest.step)
    try:
        storage.put(key, manifest.to_json(), mode="create")
    except AlreadyExistsError as exc:
        try:
            existing = LocalManifest.from_json(storage.get(key), key=key)
        except (StorageError, CorruptCheckpointError):
            existing = None
        if existing is None or existing.manifest.save_id != manifest.manifest.save_id:
            raise CommitError("local level: step already committed by another save", root=storage.url,
                              step=manifest.step, path=key) from exc


def read_local_manifest(storage: Storage, step: int) -> LocalManifest | None:
    """The committed local manifest of ``step``, or None when there is none. Corrupt: CorruptCheckpointError."""
    key = local_manifest_key(step)
    try:
        raw = storage.get(key)
    except NotFoundError:
        return None
    manifest = LocalManifest.from_json(raw, key=key)
    if manifest.step != step:
        raise CorruptCheckpointError(f"local manifest of step {step} says step {manifest.step}", root=storage.url,
                                     step=step, path=key)
    return manifest


def local_step_dirs(storage: Storage) -> list[int]:
    """Every step with a directory on the local level's records (committed or not), ascending."""
    return sorted(s for s in (parse_step_dir(n) for n in storage.list_dirs(LEVELS_LOCAL)) if s is not None)


def local_committed_steps(storage: Storage) -> list[int]:
    return [s for s in local_step_dirs(storage) if storage.exists(local_manifest_key(s))]


def delete_local_step(storage: Storage, step: int) -> None:
    storage.delete_prefix(local_step_key(step))


def level_rows(storage: Storage) -> dict[int, dict[str, Any]]:
    """Per committed local-level step: where it is held (for ``ckptio ls``). Corrupt records are reported."""
    rows: dict[int, dict[str, Any]] = {}
    for step in local_committed_steps(storage):
        try:
            lm = read_local_manifest(storage, step)
        except (CorruptCheckpointError, StorageError) as exc:
            rows[step] = {"corrupt": str(exc)}
            continue
        if lm is None:
            continue
        nodes = sorted({n for holders in lm.holders.values() for n in holders})
        rows[step] = {"nodes": nodes, "world_size": lm.manifest.world_size, "bytes": lm.manifest.total_bytes,
                      "files": len(lm.manifest.files), "durable_too": lm.durable}
    return rows


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
