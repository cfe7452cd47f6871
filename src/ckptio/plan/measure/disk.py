"""The local disk beneath a store, as a save's writers meet it: the measurement behind
:class:`~ckptio.plan.costs.inputs.StoreTiming` where a store is this host's own disk, or a budget on it (the demo's
and the benchmarks' paced stores) whose real write may take longer than the budget books. Its probe files are
removed on every exit path. And the cold page cache a read measurement starts from (:func:`drop_page_cache`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ckptio.plan.costs.inputs import StoreTiming
from ckptio.plan.measure.memory import dirty_background_bytes


@dataclass(frozen=True, slots=True)
class DiskRates:
    """A local disk's write bandwidth as a save's writers meet it, bytes/s (:func:`measure_disk`)."""

    direct_bytes_per_s: float
    """An ``O_DIRECT`` writer's (ckptio's on a durable POSIX tier): one 64 MiB write + fsync."""

    writeback_bytes_per_s: float
    """A buffered writer's at its fsync (DCP's ``FileSystemWriter``): the kernel's write-back of 128 MiB already in
    the page cache, the fsync timed alone."""


def measure_disk(directory: str, *, direct_bytes: int = 64 << 20, writeback_bytes: int = 128 << 20) -> DiskRates:
    """The disk under ``directory`` as :class:`DiskRates` (best of two each; the probe files are removed).

    Where a store is a budget on this host's own disk (the demo's and the benchmarks' paced stores), a writer takes the
    longer of its booking and its real write (:attr:`~ckptio.plan.costs.inputs.StoreTiming.paced_store_s`): this is the
    real write. Its files are deleted when it ends, and pages freed a moment ago make the next page-cache writes several
    times cheaper on a VM: call :func:`ckptio.plan.measure.writer_costs.measure_writer_costs` first. Without
    ``O_DIRECT`` (tmpfs) the direct rate is the write-back one: ckptio then writes through memory pages as DCP does.
    """
    from ckptio.storage.posix.direct_io import DirectIOUnsupported, write_direct

    def best(write: Callable[[str], float]) -> float:
        times = []
        for n in range(2):
            path = os.path.join(directory, f".ckptio-disk-probe-{n}")
            try:
                times.append(write(path))
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        return max(min(times), 1e-9)

    def writeback(path: str) -> float:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, os.urandom(writeback_bytes))
            began = time.perf_counter()
            os.fsync(fd)
            return time.perf_counter() - began
        finally:
            os.close(fd)

    direct_data = memoryview(os.urandom(direct_bytes))

    def direct(path: str) -> float:
        began = time.perf_counter()
        write_direct(path, [direct_data])
        return time.perf_counter() - began

    writeback_rate = writeback_bytes / best(writeback)
    try:
        direct_rate = direct_bytes / best(direct)
    except DirectIOUnsupported:
        direct_rate = writeback_rate
    return DiskRates(direct_bytes_per_s=direct_rate, writeback_bytes_per_s=writeback_rate)


def on_local_disk(disk: DiskRates, *, job_bytes: float, ranks: int, booked_s: float | None = None,
                  direct_io: bool = True) -> StoreTiming:
    """The store of ``ranks`` writing ``job_bytes`` at once to this host's disk: ``O_DIRECT`` and write-back times
    from ``disk``, the kernel's write-back threshold shared by the ranks (a buffered file below it moves at its
    fsync), ``booked_s``, the budget a paced store books on that disk (the demo's and bench_planner's; None for the
    bare disk, bench_fsdp's), and whether ckptio's writer writes it with ``O_DIRECT``."""
    dirty = dirty_background_bytes()
    return StoreTiming(store_s=job_bytes / disk.direct_bytes_per_s, direct_io=direct_io,
                       writeback_store_s=job_bytes / disk.writeback_bytes_per_s, paced_store_s=booked_s,
                       dirty_background_bytes=None if dirty is None else dirty / ranks)


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache(paths: Iterable[str]) -> str:
    """Evict ``paths`` (files, or directories walked) from the page cache, so the next reads of them come from the
    disk: the whole clean cache where this process may (root: ``1`` into ``/proc/sys/vm/drop_caches``), else each
    file's pages (``posix_fadvise(POSIX_FADV_DONTNEED)``, which the kernel may decline for a page another process
    has mapped). Dirty pages cannot be dropped, so everything is synced first. Returns ``"drop_caches"``,
    ``"fadvise"``, or ``"none"`` where neither exists (not Linux); a file that vanished or cannot be opened is left
    alone."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("1")
        return "drop_caches"
    except OSError:
        pass
    if not hasattr(os, "posix_fadvise"):
        return "none"
    for path in paths:
        files = [path] if not os.path.isdir(path) else [
            os.path.join(root, name) for root, _, names in os.walk(path) for name in names]
        for file in files:
            try:
                fd = os.open(file, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "fadvise"
