"""``ckptio ls ROOT`` and ``ckptio verify ROOT [--step N] [--strict]``: what is on a checkpoint root, and is it intact.

Both agree on what is committed: a step is committed on a level iff that level's manifest exists (the durable
``step-XXXXXXXX/manifest.json``, the local level's ``levels/local/step-XXXXXXXX/manifest.json``). ``ls`` names the
levels of each step; ``verify`` checks each step on each of them (a local-level step by its records only: its data
is on node-local disks, and the output says so).

Neither command executes anything from the store: ``ls`` reads only JSON (manifests, ``latest``), and ``verify``
reads ``.metadata`` with the restricted unpickler only (DCP's metadata classes; see docs/security.md) and never
unpickles values. Exit codes: ``verify`` 0 intact, 1 a problem (or, with ``--strict``, a warning), 2 usage.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ckptio import format as fmt
from ckptio.errors import CkptError, CorruptCheckpointError
from ckptio.format.local_level_records import level_rows, merge_level_rows
from ckptio.storage import open_storage


def register(sub: Any) -> None:
    ls = sub.add_parser("ls", help="list the steps under a checkpoint root")
    ls.add_argument("root", help="checkpoint root (path or s3://bucket/prefix)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_ls)
    verify = sub.add_parser("verify", help="re-read committed steps and check every file's size and checksum")
    verify.add_argument("root", help="checkpoint root (path or s3://bucket/prefix)")
    verify.add_argument("--step", type=int, default=None, help="verify only this step")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.add_argument("--strict", action="store_true",
                        help="fail (exit 1) on warnings too: orphaned files, stale or missing rank indexes")
    verify.set_defaults(func=cmd_verify)


def _step_rows(root: str) -> list[dict[str, Any]]:
    storage = open_storage(root)
    latest = fmt.read_latest(storage)
    rows = []
    for step in fmt.all_step_dirs(storage):
        row: dict[str, Any] = {"step": step, "committed": False, "latest": step == latest}
        try:
            manifest = fmt.read_manifest(storage, step)
        except CorruptCheckpointError as exc:
            row.update(committed=True, corrupt=str(exc))  # the manifest exists, and fails its checks
            rows.append(row)
            continue
        except CkptError:
            rows.append(row)
            continue
        row.update(committed=True, bytes=manifest.total_bytes, files=len(manifest.files),
                   world_size=manifest.world_size, created=manifest.created)
        rows.append(row)
    return merge_level_rows(rows, level_rows(storage))  # the levels each step is committed on, and where it is held


def cmd_ls(args: argparse.Namespace) -> int:
    rows = _step_rows(args.root)
    if args.json:
        print(json.dumps({"root": args.root, "steps": rows}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"ckptio checkpoints under {args.root}")
    for col in ("step", "committed on", "bytes", "files", "ranks", "held on"):
        table.add_column(col, justify="right" if col != "committed on" else "left")
    for r in rows:
        table.add_row(str(r["step"]), _state(r), f"{r['bytes']:,}" if "bytes" in r else "-",
                      str(r.get("files", "-")), str(r.get("world_size", "-")), ", ".join(r.get("held_on", [])) or "-")
    Console().print(table)
    return 0


def _state(row: dict[str, Any]) -> str:
    """The levels a step is committed on (the levels ``verify`` checks it on), or why it is not usable."""
    if "corrupt" in row:
        return "corrupt manifest (run verify)"
    if not row["levels"]:
        return "uncommitted"
    return ", ".join(row["levels"]) + (" (latest)" if row["latest"] else "")


def cmd_verify(args: argparse.Namespace) -> int:
    storage = open_storage(args.root)
    results = fmt.verify_levels(storage, args.step)
    ok = bool(results) and all(r.ok and not (args.strict and r.warnings) for r in results)
    if args.json:
        print(json.dumps({"root": args.root, "ok": ok, "strict": args.strict,
                          "steps": [r.as_dict() for r in results]}, indent=1))
    else:
        if not results:
            print(f"no committed steps under {args.root}")
        for r in results:
            status = "ok" if r.ok else "FAILED"
            status += f", {len(r.warnings)} warning(s)" if r.warnings else ""
            if r.level == "local":
                print(f"step {r.step} (local level): {status}, records only ({r.files} files, {r.bytes:,} bytes "
                      "on node-local disks)")
            else:
                print(f"step {r.step}: {status} ({r.files} files, {r.bytes:,} bytes)")
            for p in r.problems:
                print(f"  {p}")
            for w in r.warnings:
                print(f"  warning: {w}")
            for n in r.notes:
                print(f"  note: {n}")
    return 0 if ok else 1
