"""``ckptio ls ROOT`` and ``ckptio verify ROOT [--step N]``: what is on a checkpoint root, and is it intact."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ckptio import format as fmt
from ckptio.errors import CkptError
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
    verify.set_defaults(func=cmd_verify)


def _step_rows(root: str) -> list[dict[str, Any]]:
    storage = open_storage(root)
    latest = fmt.read_latest(storage)
    rows = []
    for step in fmt.all_step_dirs(storage):
        row: dict[str, Any] = {"step": step, "committed": False, "latest": step == latest}
        try:
            manifest = fmt.read_manifest(storage, step)
        except CkptError:
            rows.append(row)
            continue
        row.update(committed=True, bytes=manifest.total_bytes, files=len(manifest.files),
                   world_size=manifest.world_size, created=manifest.created)
        rows.append(row)
    return rows


def cmd_ls(args: argparse.Namespace) -> int:
    rows = _step_rows(args.root)
    if args.json:
        print(json.dumps({"root": args.root, "steps": rows}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"ckptio checkpoints under {args.root}")
    for col in ("step", "state", "bytes", "files", "ranks"):
        table.add_column(col, justify="right" if col != "state" else "left")
    for r in rows:
        state = ("committed" + (" (latest)" if r["latest"] else "")) if r["committed"] else "uncommitted"
        table.add_row(str(r["step"]), state, f"{r.get('bytes', 0):,}" if r["committed"] else "-",
                      str(r.get("files", "-")), str(r.get("world_size", "-")))
    Console().print(table)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    storage = open_storage(args.root)
    steps = [args.step] if args.step is not None else fmt.committed_steps(storage)
    results = [fmt.verify_step(storage, s) for s in steps]
    ok = bool(results) and all(r.ok for r in results)
    if args.json:
        print(json.dumps({"root": args.root, "ok": ok, "steps": [r.as_dict() for r in results]}, indent=1))
    else:
        if not results:
            print(f"no committed steps under {args.root}")
        for r in results:
            status = "ok" if r.ok else "FAILED"
            print(f"step {r.step}: {status} ({r.files} files, {r.bytes:,} bytes)")
            for p in r.problems:
                print(f"  {p}")
    return 0 if ok else 1
