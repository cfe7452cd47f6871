"""``ckptio probe TARGET``: measure a store the way the checkpoint burst will use it.

Owns the command's flags, its progress bar and its output (a table, ``--json``, ``--out profile.json``). A
SIGTERM (a scheduler ending the job) is turned into the same clean exit as Ctrl-C, so the probe's files are
removed either way. Measuring is :mod:`ckptio.plan.measure.probe`'s job, not this module's.

A store (``s3://``) is checked before anything is written: residency (a public bucket is refused unless
``--allow-public``; a store with no API to tell is refused unless ``--store-private``), then its capabilities,
which the output lists (``capabilities`` in ``--json``; the ``--out`` profile file is unchanged).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ckptio._cli.job_args import duration_flag, int_flag, size_flag
from ckptio._cli.paths import check_output
from ckptio._proc import sigterm_as_interrupt
from ckptio.plan.measure.clock import Progress as ProgressFn
from ckptio.plan.measure.probe import SMALL_FILE_BYTES, ProbeConfig, probe, target_capabilities
from ckptio.plan.measure.profile import StorageProfile
from ckptio.plan.units import format_duration, format_rate
from ckptio.policy.residency import Residency
from ckptio.storage.capabilities import StoreCapabilities


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "probe",
        usage="ckptio probe [options]  (ckptio probe --help lists them)",
        help="measure a store: write/read throughput vs writers, fsync, metadata ops",
        description="Write, fsync, read back and delete files shaped like the job's in TARGET (a directory, "
        "or s3://bucket/prefix where that backend is installed), within --max-seconds; everything the probe "
        "writes is removed, also on Ctrl-C or SIGTERM.",
    )
    parser.add_argument("target", help="directory (created if missing, removed again) or s3:// URL")
    parser.add_argument("--writers", type=int, default=4, help="most concurrent writers (4)")
    parser.add_argument("--file-size", default="256MiB", help="size of each data file (256MiB)")
    parser.add_argument("--files-per-writer", type=int, default=2, help="files per writer and level (2)")
    parser.add_argument("--small-files", type=int, default=256, help="files for the metadata phase (256)")
    parser.add_argument("--max-seconds", default="60", help="time bound of the whole probe (60)")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync (RAM targets only)")
    parser.add_argument("--fio", action="store_true", help="also run fio in the same directory (anchor)")
    parser.add_argument("--out", help="write the storage profile here (read by plan, admit, simulate)")
    parser.add_argument("--json", action="store_true", help="print the profile as JSON")
    parser.add_argument("--allow-public", action="store_true", help="probe a public bucket (refused by default)")
    parser.add_argument("--store-private", action="store_true",
                        help="declare the store private where it has no public-access API (on-prem stores)")
    parser.set_defaults(func=run)


# Bounds of what one probe may ask for: beyond them it is a typo, not a measurement (threads, file names and
# time all grow with these, and the time bound only stops the phases, not the setting up of their work).
_MAX_WRITERS = 1024
_MAX_FILES_PER_WRITER = 10_000
_MAX_SMALL_FILES = 100_000
_MAX_FILE_BYTES = float(1 << 40)
MIN_PROBE_SECONDS = 0.1
"""A shorter bound measures nothing: the probe's phases each need a few system calls."""
MAX_PROBE_SECONDS = 86400.0


def probe_config(args: argparse.Namespace) -> ProbeConfig:
    return ProbeConfig(
        writers=int_flag(args.writers, "--writers", low=1, high=_MAX_WRITERS),
        file_size_bytes=int(size_flag(args.file_size, "--file-size", low=SMALL_FILE_BYTES, high=_MAX_FILE_BYTES)),
        files_per_writer=int_flag(args.files_per_writer, "--files-per-writer", low=1, high=_MAX_FILES_PER_WRITER),
        small_files=int_flag(args.small_files, "--small-files", low=1, high=_MAX_SMALL_FILES),
        max_seconds=duration_flag(args.max_seconds, "--max-seconds", low=MIN_PROBE_SECONDS, high=MAX_PROBE_SECONDS),
        fsync=not args.no_fsync,
    )


def run(args: argparse.Namespace) -> int:
    config = probe_config(args)
    check_output(args.out, "--out")
    err = Console(file=sys.stderr)
    residency = Residency(allow_public=args.allow_public, store_private=args.store_private)
    with sigterm_as_interrupt(), _progress_bar(err, enabled=not args.json) as progress:
        profile = probe(args.target, config, progress=progress, fio=args.fio, residency=residency)
    caps = target_capabilities(args.target, residency)  # found before the probe wrote; cached
    if args.out:
        profile.save(args.out)
    if args.json:
        print(json.dumps({**profile.to_json(), "capabilities": caps.to_json() if caps else None}, indent=2))
    else:
        print_profile(Console(file=sys.stdout), profile)
        if caps is not None:
            print_capabilities(Console(file=sys.stdout), caps)
        if args.out:
            print(f"profile written to {args.out}")
    return 0


@contextmanager
def _progress_bar(console: Console, *, enabled: bool) -> Iterator[ProgressFn | None]:
    if not enabled:
        yield None
        return
    columns = (TextColumn("probe {task.description:<18}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting", total=1.0)
        yield lambda phase, fraction: bar.update(task, description=phase, completed=fraction)


def print_profile(console: Console, p: StorageProfile) -> None:
    table = Table(title=f"ckptio probe {p.target} ({p.fs_type or p.kind})", title_justify="left")
    table.add_column("writers", justify="right")
    table.add_column("write", justify="right")
    table.add_column("read", justify="right")
    for point in p.concurrency:
        read = format_rate(point.read_bytes_per_s) if point.read_bytes_per_s else "-"
        table.add_row(str(point.writers), format_rate(point.write_bytes_per_s), read)
    console.print(table)
    ops = ", ".join(f"{op} {rate:,.0f}/s" for op, rate in p.metadata.items())
    console.print(f"metadata: {p.metadata_ops_per_s:,.0f} ops/s ({ops})", highlight=False)
    if p.serialize_bytes_per_s:
        rate = format_rate(p.serialize_bytes_per_s)
        console.print(f"serialize + checksum, one writer: {rate}", highlight=False)
    if p.fsync_s is not None:
        console.print(f"fsync of a small file: {format_duration(p.fsync_s)} (median)", highlight=False)
    if p.fio:
        fio_write, fio_read = p.fio["write_bytes_per_s"], p.fio["read_bytes_per_s"]
        console.print(
            f"fio in the same directory: write {format_rate(fio_write)}, read {format_rate(fio_read)}; "
            f"probe ÷ fio: write {p.write_bytes_per_s / fio_write:.2f}, "
            f"read {p.read_bytes_per_s / fio_read:.2f}",
            highlight=False,
        )
    note = " (time bound reached: figures from fewer bytes)" if p.truncated else ""
    console.print(f"took {format_duration(p.seconds or 0.0)}{note}", highlight=False)


def print_capabilities(console: Console, caps: StoreCapabilities) -> None:
    """One line per capability: yes / NO / unknown, and what was seen."""
    console.print(f"store capabilities of {caps.url}:", highlight=False)
    for check in caps.checks:
        verdict = {True: "yes", False: "NO", None: "unknown"}[check.ok]
        console.print(f"  {check.name.replace('_', ' '):<18} {verdict:<8} {check.detail}", highlight=False,
                      soft_wrap=True)
    if not caps.conditional_writes:
        console.print(
            "  conditional writes are missing: a default Checkpointer refuses this store (StoreCapabilityError); "
            'commit="lease" is the documented, weaker opt-in (docs/s3.md)',
            highlight=False,
            soft_wrap=True,
        )
