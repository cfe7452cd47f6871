"""Reading a run's JSONL event files: which files a path names, and every record in them, checked.

The one reader of event files: the report and the demo (which reads its own run's file while the writer still
appends to it) both come here, so a file is matched and a line is judged the same way everywhere. A bad line is
a named error with file and line. Must never interpret the events (``obs.timeline`` does) nor write them
(``obs.events`` does).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from ckptio.errors import ConfigError, CorruptCheckpointError
from ckptio.obs.events import EVENTS

__all__ = ["expand_event_paths", "load_events", "read_event_file"]

_REQUIRED = ("ts", "mono", "rank", "event")


def expand_event_paths(paths: list[str] | tuple[str, ...]) -> list[str]:
    """Files for the given paths: a file as is, a directory's ``*.jsonl``, or an ``events_path`` as configured
    (``run/events.jsonl`` finds ``run/events.rank*.jsonl``; ``{rank}`` matches every rank)."""
    found: list[str] = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        if os.path.isdir(path):
            pattern = os.path.join(path, "*.jsonl")
        elif "{rank}" in path:
            pattern = path.replace("{rank}", "*")
        else:
            root, ext = os.path.splitext(path)
            pattern = f"{glob.escape(root)}.rank*{ext or '.jsonl'}"
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise ConfigError(f"no event file at {path!r} (also looked for {pattern!r})", path=path)
        found.extend(matches)
    return list(dict.fromkeys(found))


def load_events(paths: list[str] | tuple[str, ...] | str) -> list[dict[str, Any]]:
    """All events of the given files, ordered by rank then monotonic time; identical records are kept once.

    Raises :class:`CorruptCheckpointError` naming the file and line for a line that is not a JSON object
    with ``ts``/``mono``/``rank``/``event``, or that was cut short (a crash mid-write). Unknown event
    names are skipped: a newer writer's log stays readable.
    """
    files = expand_event_paths([paths] if isinstance(paths, str) else list(paths))
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    for path in files:
        for record in _read_file(path):
            key = json.dumps(record, sort_keys=True)
            if key not in seen:
                seen.add(key)
                records.append(record)
    records.sort(key=lambda r: (r["rank"], r["mono"]))
    return records


def read_event_file(path: str, *, live: bool = False) -> list[dict[str, Any]]:
    """The known events of one file, in file order, each checked as :func:`load_events` checks them.

    ``live=True`` reads a file a process may still be appending to: a missing file has no events yet, and a last
    line without its newline is being written right now, so it is left for the next read instead of raised.
    """
    if live and not os.path.exists(path):
        return []
    return _read_file(path, live=live)


def _read_file(path: str, *, live: bool = False) -> list[dict[str, Any]]:
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    records = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        truncated = number == len(lines)  # the last line has no newline: its writer died mid-append
        if truncated and live:
            break  # ... or is still appending it
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, an endless integer
            what = "truncated line (no newline; the writer stopped mid-append)" if truncated else "not JSON"
            raise CorruptCheckpointError(f"bad event file: line {number}: {what}: {exc}", path=path) from exc
        problem = _problem(record)
        if problem:
            raise CorruptCheckpointError(f"bad event file: line {number}: {problem}", path=path)
        if record["event"] in EVENTS:
            records.append(record)
    return records


def _problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    missing = [key for key in _REQUIRED if key not in record]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    if not isinstance(record["rank"], int) or not all(
        isinstance(record[k], int | float) for k in ("ts", "mono")
    ):
        return "rank must be an int and ts/mono numbers"
    return None

