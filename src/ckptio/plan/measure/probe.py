"""The storage probe: measure a target the way a checkpoint burst will use it, then clean up.

Owns ``ckptio probe``'s measurements: write and read throughput against the number of concurrent writers
(files shaped like the job's, each fsynced and published by rename, as the engine writes them), the cost of an
fsync, and the rate of each metadata operation a commit makes (:mod:`ckptio.plan.measure.probe_metadata`: create,
stat, rename, list, fsync, unlink). Everything lives under one
hidden directory of the target, removed on every exit path — success, error, Ctrl-C — together with any parent
the probe had to create. The probe must never touch anything outside that directory, and never run past its
time bound by more than one chunk's write per writer.

A POSIX directory is probed with plain system calls (so writes can stop mid-file when time is up, and the page
cache can be dropped before reading back); any other :class:`~ckptio.storage.Storage` (``s3://``, or a wrapped
store in tests) through the storage protocol, one object per file. The writers' serialize rate is measured on
this host too (:mod:`ckptio.plan.measure.serialize_rate`): it is the stage before the store.

Before it writes anything to a store, the probe checks residency (a public bucket is refused unless the given
:class:`~ckptio.policy.residency.Residency` allows it) and then the store's capabilities
(:mod:`ckptio.storage.capabilities`: conditional writes, objects written in parts, ranged reads), which
:func:`target_capabilities` returns afterwards without asking the store again. A directory's capabilities are
tried too (its conditional writes are hard links and exclusive creates, which not every filesystem honours), in
a scratch directory of their own.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from typing import TypeVar

import numpy as np

from ckptio.errors import ConfigError
from ckptio.plan.measure.clock import Clock, Progress
from ckptio.plan.measure.fio import run_fio
from ckptio.plan.measure.probe_metadata import SmallFilePhases, planner_ops_per_s
from ckptio.plan.measure.probe_targets import PosixTarget, ProbeTarget, StorageTarget
from ckptio.plan.measure.profile import ConcurrencyPoint, StorageProfile
from ckptio.plan.measure.serialize_rate import serialize_bytes_per_s
from ckptio.policy.residency import Residency, check_residency
from ckptio.storage import PosixRoot, PosixStorage, open_storage, parse_root
from ckptio.storage.base import Storage
from ckptio.storage.capabilities import StoreCapabilities, detect_capabilities

CHUNK_BYTES = 16 << 20
"""Write/read unit: the time bound is checked between chunks."""
SMALL_FILE_BYTES = 4096
# Shares of the time bound: throughput levels, then fsync and metadata; the rest is headroom for the last
# fsync and the clean-up. With --fio, fio's share comes out of the throughput share.
_THROUGHPUT_SHARE = 0.70
_METADATA_SHARE = 0.15
_FIO_SHARE = 0.30
_SERIALIZE_BYTES = 64 << 20
SERIALIZE_MIN_BOUND_S = 20.0
"""A probe bounded below this many seconds skips the serialize measurement (unless torch is loaded already): loading
torch would take much of a short bound."""
_LAST_PHASE_END = 0.95

T = TypeVar("T")


@dataclass(kw_only=True, slots=True)
class ProbeConfig:
    """What the probe writes and how long it may take."""

    writers: int = 4
    """Most concurrent writers; levels 1, 2, 4, … up to this are measured."""

    file_size_bytes: int = 256 << 20
    """Size of each data file (shape it like the job's files)."""

    files_per_writer: int = 2
    """Data files each writer writes per concurrency level."""

    small_files: int = 256
    """Small files for the metadata phase."""

    max_seconds: float = 60.0
    """Time bound of the whole probe."""

    fsync: bool = True
    """fsync data files before they count (off only for RAM targets or tests)."""

    def __post_init__(self) -> None:
        if self.writers < 1:
            raise ConfigError(f"writers must be >= 1, got {self.writers}")
        if self.file_size_bytes < SMALL_FILE_BYTES:
            raise ConfigError(f"file size must be >= {SMALL_FILE_BYTES} bytes, got {self.file_size_bytes}")
        if self.files_per_writer < 1:
            raise ConfigError(f"files per writer must be >= 1, got {self.files_per_writer}")
        if self.small_files < 1:
            raise ConfigError(f"small files must be >= 1, got {self.small_files}")
        if not self.max_seconds > 0:
            raise ConfigError(f"max seconds must be > 0, got {self.max_seconds}")

    def levels(self) -> list[int]:
        """Concurrency levels: powers of two below ``writers``, then ``writers``."""
        out, level = [], 1
        while level < self.writers:
            out.append(level)
            level *= 2
        return [*out, self.writers]


def probe(
    target: str | os.PathLike[str] | Storage,
    config: ProbeConfig | None = None,
    *,
    progress: Progress | None = None,
    fio: bool = False,
    residency: Residency | None = None,
) -> StorageProfile:
    """Measure ``target`` (a directory or a storage) and return its profile; leaves nothing behind.

    A store (not a POSIX directory) is checked first, before anything is written: ``residency`` (default: a
    public bucket is refused, ResidencyError), then its capabilities (cached: :func:`target_capabilities`).
    """
    config = config or ProbeConfig()
    probe_target = _open_target(target, config)
    if isinstance(probe_target, StorageTarget):
        check_store_target(probe_target.storage, residency)
    run = _ProbeRun(probe_target, config, Clock(config.max_seconds, progress), fio=fio)
    try:
        run.target.setup()
        run.check_space()
        run.measure()
    except BaseException:
        run.clock.stop.set()  # workers still running see it between chunks
        raise
    finally:
        run.target.cleanup()
    run.clock.report("done")
    return run.profile()


def check_store_target(storage: Storage, residency: Residency | None = None) -> StoreCapabilities:
    """Residency, then capabilities, of a store about to be probed. Raises ResidencyError or
    StoreCapabilityError (a store without the APIs residency needs) before any write."""
    check_residency(storage, residency or Residency())
    return detect_capabilities(storage)


def target_capabilities(
    target: str | os.PathLike[str] | Storage, residency: Residency | None = None
) -> StoreCapabilities:
    """What the store at ``target`` honours (cached in this process: free after :func:`probe` of it). Checks
    residency first, like the probe. A directory is tried in a scratch directory below it, removed afterwards
    with any parent it had to create, so that the root is left as it was found."""
    if isinstance(target, Storage):
        return check_store_target(target, residency)
    root = parse_root(target)
    if isinstance(root, PosixRoot):
        return _directory_capabilities(root)
    storage = open_storage(root)
    try:
        return check_store_target(storage, residency)
    finally:
        storage.close()


def _directory_capabilities(root: PosixRoot) -> StoreCapabilities:
    scratch = PosixTarget(root.path, _scratch_name(), fsync=True)
    scratch.setup()
    try:
        caps = detect_capabilities(PosixStorage(scratch.root), refresh=True)
    finally:
        scratch.cleanup()
    scratch_url = PosixStorage(scratch.root).url
    checks = tuple(replace(c, detail=c.detail.replace(scratch_url, root.url)) for c in caps.checks)
    return StoreCapabilities(url=root.url, checks=checks)


def _scratch_name() -> str:
    return f".ckptio-probe-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _open_target(target: str | os.PathLike[str] | Storage, config: ProbeConfig) -> ProbeTarget:
    name = _scratch_name()
    if isinstance(target, Storage):
        return StorageTarget(target, name)
    root = parse_root(target)  # a clear ConfigError for schemes it does not know
    if isinstance(root, PosixRoot):
        return PosixTarget(root.path, name, fsync=config.fsync)
    return StorageTarget(open_storage(root), name)


def _pattern(size: int) -> memoryview:
    # Random bytes so compressing or deduplicating filesystems cannot flatter the figure.
    return memoryview(np.random.default_rng().bytes(size))


def _rate(nbytes: int, start: float) -> float:
    elapsed = time.monotonic() - start
    return nbytes / elapsed if nbytes and elapsed > 0 else 0.0


class _ProbeRun:
    """One probe: its target, configuration and clock, and what it has measured so far."""

    def __init__(self, target: ProbeTarget, config: ProbeConfig, clock: Clock, *, fio: bool) -> None:
        self.target = target
        self.config = config
        self.clock = clock
        self.fio = fio
        self.points: list[ConcurrencyPoint] = []
        self.fsync_s: float | None = None
        self.metadata: dict[str, float] = {}
        self.fio_figures: dict[str, float] | None = None
        self.serialize_rate: float | None = None

    def parallel(self, workers: int, work: Callable[[int], T]) -> list[T]:
        """``work(i)`` on ``workers`` threads at once; an interrupt stops them all before it returns."""
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptio-probe") as pool:
            try:
                return list(pool.map(work, range(workers)))
            except BaseException:
                # Set before the pool's exit waits for its threads, which check it between chunks.
                self.clock.stop.set()
                raise

    def check_space(self) -> None:
        need = self.config.writers * self.config.files_per_writer * self.config.file_size_bytes
        free = self.target.free_bytes()
        if free is not None and free < need * 1.1:
            raise ConfigError(
                f"the probe needs {need / 2**30:.1f} GiB free at {self.target.url} and only "
                f"{free / 2**30:.1f} GiB is; lower --file-size, --files-per-writer or --writers"
            )

    def measure(self) -> None:
        self.serialize_rate = self.serialize()
        throughput_share = _THROUGHPUT_SHARE - (_FIO_SHARE if self.fio else 0.0)
        self.throughput(self.clock.at(throughput_share))
        small = SmallFilePhases(self.target, workers=self.config.writers, small_files=self.config.small_files,
                                clock=self.clock, payload=bytes(_pattern(SMALL_FILE_BYTES)), parallel=self.parallel)
        self.fsync_s = small.fsync_cost(self._phase_end(throughput_share + 0.03, 0.03))
        self.metadata = small.metadata_rates(self._phase_end(throughput_share + _METADATA_SHARE, 0.10))
        if self.fio:
            self.fio_figures = self.run_fio()

    def _phase_end(self, planned_share: float, least_share: float) -> float:
        """A phase ends at its planned share of the bound, or later if earlier phases overran, but gets at
        least ``least_share`` of the bound and never runs past the headroom kept for the clean-up."""
        later = time.monotonic() + least_share * self.config.max_seconds
        return min(max(self.clock.at(planned_share), later), self.clock.at(_LAST_PHASE_END))

    def serialize(self) -> float | None:
        """The writers' serialize rate, when the bound leaves room to load torch for it (seconds, cold)."""
        if self.config.max_seconds < SERIALIZE_MIN_BOUND_S and "torch" not in sys.modules:
            return None
        self.clock.report("serialize")
        # Tensors as large as the job's files (up to 64 MiB: larger ones serialize no faster), or 4 MiB when the
        # bound is short, so the measurement stays a small part of the probe's time even on a slow host.
        large = self.config.max_seconds >= SERIALIZE_MIN_BOUND_S
        size = min(self.config.file_size_bytes, _SERIALIZE_BYTES if large else 4 << 20)
        return serialize_bytes_per_s(size, writers=self.config.writers)

    def throughput(self, end: float) -> None:
        """Write then read back at each concurrency level, each level given an equal share of the time."""
        levels = self.config.levels()
        block = _pattern(min(CHUNK_BYTES, self.config.file_size_bytes))
        per_level = (end - time.monotonic()) / len(levels)
        for writers in levels:
            if self.points and self.clock.expired(end):
                break
            start = time.monotonic()
            files = range(self.config.files_per_writer)
            names = [[f"w{writers}/{w}/{f}.bin" for f in files] for w in range(writers)]
            self.clock.report(f"write × {writers}")
            write_end, read_end = min(start + per_level * 0.6, end), min(start + per_level, end)
            written = self.parallel(writers, partial(self._write, names, block, write_end))
            write_rate = _rate(sum(n for files in written for _, n in files), start)
            self.clock.report(f"read × {writers}")
            read_start = time.monotonic()
            read_rate = _rate(sum(self.parallel(writers, partial(self._read, written, read_end))), read_start)
            self.target.remove_tree(f"w{writers}")
            self.points.append(
                ConcurrencyPoint(writers=writers, write_bytes_per_s=write_rate, read_bytes_per_s=read_rate)
            )

    def _write(
        self, names: list[list[str]], block: memoryview, deadline: float, writer: int
    ) -> list[tuple[str, int]]:
        """``(name, bytes)`` of each file this writer wrote (the deadline may cut the last one short)."""
        written = []
        for name in names[writer]:
            if self.clock.expired(deadline):
                break
            nbytes = self.target.write_file(name, self.config.file_size_bytes, block, self.clock, deadline)
            if nbytes:
                written.append((name, nbytes))
        return written

    def _read(self, written: list[list[tuple[str, int]]], deadline: float, reader: int) -> int:
        buffer = bytearray(CHUNK_BYTES)
        read = 0
        for name, _ in written[reader]:
            if self.clock.expired(deadline):
                break
            read += self.target.read_file(name, buffer, self.clock, deadline)
        return read

    def run_fio(self) -> dict[str, float] | None:
        directory = self.target.fio_directory()
        if directory is None:
            return None
        self.clock.report("fio")
        return run_fio(
            directory,
            writers=self.config.writers,
            file_size_bytes=self.config.file_size_bytes,
            runtime_s=_FIO_SHARE * self.config.max_seconds,
            stop=self.clock.stop,
        )

    def profile(self) -> StorageProfile:
        writes = [p.write_bytes_per_s for p in self.points if p.write_bytes_per_s > 0]
        reads = [p.read_bytes_per_s for p in self.points if p.read_bytes_per_s]
        metadata_ops_per_s = planner_ops_per_s(self.metadata)
        if not writes or not reads or not metadata_ops_per_s:
            raise ConfigError(
                f"the probe of {self.target.url} measured nothing within {self.config.max_seconds:g} s: "
                "raise --max-seconds or lower --file-size"
            )
        return StorageProfile(
            target=self.target.url,
            kind=self.target.kind,
            fs_type=self.target.fs_type(),
            write_bytes_per_s=max(writes),
            per_writer_bytes_per_s=self.points[0].write_bytes_per_s or max(writes),
            read_bytes_per_s=max(r for r in reads if r is not None),
            metadata_ops_per_s=metadata_ops_per_s,
            metadata=self.metadata,
            fsync_s=self.fsync_s,
            serialize_bytes_per_s=self.serialize_rate,
            concurrency=self.points,
            free_bytes=self.target.free_bytes(),
            file_size_bytes=self.config.file_size_bytes,
            seconds=self.clock.elapsed(),
            truncated=self.clock.truncated,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            fio=self.fio_figures,
        )
