"""``ckptio report EVENTS... --out FILE.png|FILE.html [--json]``: what checkpoints cost a run.

Only parses arguments, checks the numbers the events carry, and prints; reading, summarizing and drawing live in
``ckptio.obs.report``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from ckptio._cli.paths import check_output, writing
from ckptio.errors import CkptError, ConfigError
from ckptio.plan.units import quoted


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="timeline picture and summary of checkpoint cost from JSONL events",
        description=(
            "Read the JSONL event files of a run (one per rank; a configured events_path such as "
            "run/ev.jsonl finds run/ev.rank*.jsonl), attribute every step (staging, flush overlap, clean) "
            "and write a timeline picture (.png) or a page with the picture and the summary table (.html)."
        ),
    )
    parser.add_argument("events", nargs="+", metavar="EVENTS", help="event files, directories or events_path")
    parser.add_argument("--out", "-o", help="output file: .png or .html")
    parser.add_argument("--json", action="store_true", help="print the summary numbers as JSON on stdout")
    parser.add_argument("--title", help="title of the picture and page")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ckptio.obs import report

    if not args.out and not args.json:
        raise ConfigError("nothing to do: give --out FILE.png|FILE.html and/or --json")
    check_output(args.out, "--out")
    try:
        records = report.load_events(args.events)
    except OSError as exc:
        if isinstance(exc, CkptError):
            raise
        raise ConfigError(f"cannot read {exc.filename or ', '.join(args.events)!s}: {exc.strerror or exc}",
                          path=exc.filename) from None
    if not records:
        raise ConfigError(f"no events in {', '.join(args.events)}")
    _check_numbers(records, args.events)
    if args.out:
        with writing(args.out, "--out"):
            summary = report.write_report(records, args.out, title=args.title)
    else:
        summary = report.summarize(records)
    if args.json:
        print(report.summary_to_json(summary))
    else:
        for line in summary.verdicts:
            print(line)
        sys.stdout.flush()  # keep the verdicts before the stderr line when both go to one terminal
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


MAX_MAGNITUDE = 1e18
"""No figure a run logs is larger (bytes of an exabyte, seconds since the epoch, step numbers): a larger one, an
infinity or a NaN is a damaged or forged file, and the timeline's arithmetic is not made to survive it."""


def _check_numbers(records: list[dict[str, Any]], sources: list[str]) -> None:
    """Every number in every record finite and within :data:`MAX_MAGNITUDE`, else a ConfigError naming the files
    (``EVENTS``), the event and the field."""
    for record in records:
        for key, value in _numbers(record):
            if abs(value) <= MAX_MAGNITUDE:  # NaN fails this comparison, infinities and huge integers exceed it
                continue
            where = f"rank {quoted(record.get('rank'))}, step {quoted(record.get('step'))}"
            raise ConfigError(f"EVENTS {', '.join(sources)}: a {quoted(record.get('event'))} event ({where}) has "
                              f"{key} = {quoted(value)}: not a figure a run logs (a finite number within "
                              f"±{MAX_MAGNITUDE:g})")


def _numbers(value: Any, key: str = "", depth: int = 0) -> Iterator[tuple[str, float]]:
    """``(key, number)`` of every int and float in ``value``, nested dicts and lists included (bools are not)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, value
    elif depth < 8 and isinstance(value, dict):
        for inner, item in value.items():
            yield from _numbers(item, f"{key}.{inner}" if key else str(inner), depth + 1)
    elif depth < 8 and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _numbers(item, f"{key}[{index}]", depth + 1)
