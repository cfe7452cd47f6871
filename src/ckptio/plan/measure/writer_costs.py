"""The per-byte CPU costs of each piece of work a save does on this host
(:class:`~ckptio.plan.costs.inputs.WriterCosts`), and the bandwidth of a copy into a preallocated buffer (the blocking
copy of a CPU job's async save).

Each cost is CPU time of one thread, so other processes' load on a shared host slows the wall clock but not the
figure. It must never keep what it writes: its file sinks are removed when it returns.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckptio.plan.costs.inputs import WriterCosts
from ckptio.plan.measure.memory import memory_available

if TYPE_CHECKING:
    import torch

_COPY_PROBE_BYTES = 64 << 20


def measure_copy_bandwidth() -> float:
    """Bytes per second of a copy into a preallocated buffer (best of three)."""
    import torch

    source = torch.ones(_COPY_PROBE_BYTES // 4)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - began)
    return _COPY_PROBE_BYTES / max(best, 1e-9)


_COST_PROBE_BYTES = 32 << 20
_COST_REPEATS = 5


def measure_writer_costs(nbytes: int = _COST_PROBE_BYTES, *, directory: str | None = None) -> WriterCosts:
    """Bytes per CPU-second of one core for each piece of work a save does on this host (single thread), as
    :class:`~ckptio.plan.costs.inputs.WriterCosts` (its ``dcp_items_per_s`` is not probed: the default). Each figure is
    CPU time of the calling thread (``time.thread_time``: user and kernel, page faults included), so other processes'
    load on a shared host slows the wall clock but not the figure; the median of a few repeats. ``directory`` holds the
    file sinks (default: the temp dir); they are removed. Every write goes to a new file kept until the end, as every
    save writes new files: the page cache grows, and its page allocation is part of the cost (on a VM whose free memory
    goes back to the hypervisor it is most of it). Runs in this process: ``torch.save`` here keeps torch's zip CRC on,
    as DCP's writer does. Before the writes into files it spends the pool of page-cache pages freed a moment ago, which
    a VM hands out several times cheaper than the pages a save's files meet (:func:`_take_freed_page_cache`: up to 8 GiB
    written, removed with the rest).
    """
    import tempfile

    import crc32c
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the writers and the staging copies each run on one thread
    source = torch.rand(max(nbytes // 4, 1))
    target = torch.empty_like(source).copy_(source)  # touched: a reused staging slot
    raw = source.numpy().data.cast("B")
    try:
        with tempfile.TemporaryDirectory(dir=directory, prefix=".ckptio-costs-") as scratch:
            sinks = _FileSinks(scratch, source, raw)
            in_memory = {
                "copy_bytes_per_s": lambda: target.copy_(source),
                "fresh_copy_bytes_per_s": lambda: torch.empty_like(source).copy_(source),
                "checksum_bytes_per_s": lambda: crc32c.crc32c(raw),
            }
            rates = {name: raw.nbytes / _median_cpu_seconds(fn) for name, fn in in_memory.items()}
            _take_freed_page_cache(sinks.new_file, cold_below=rates["fresh_copy_bytes_per_s"] / 2)
            to_files = {
                "page_cache_bytes_per_s": sinks.page_cache_write,
                "torch_save_bytes_per_s": sinks.torch_save,
                "direct_write_bytes_per_s": sinks.direct_write,
            }
            rates |= {name: raw.nbytes / _median_cpu_seconds(fn) for name, fn in to_files.items()}
            return WriterCosts(**rates)
    finally:
        torch.set_num_threads(threads)


class _FileSinks:
    """The writes of the cost probe into files: each into a new file under ``directory``, kept until the caller
    removes the directory, as every save writes new files (the growing page cache is part of the cost)."""

    def __init__(self, directory: str, source: torch.Tensor, raw: memoryview) -> None:
        import torch

        from ckptio.storage.posix.direct_io import DirectIOUnsupported, write_direct

        self._directory, self._source, self._raw = directory, source, raw
        self._names = itertools.count()
        # Bound here, not imported in the timed writes: an import's look-up is no part of a save's cost.
        self._torch_save, self._write_direct, self._unsupported = torch.save, write_direct, DirectIOUnsupported

    def new_file(self) -> str:
        return os.path.join(self._directory, str(next(self._names)))

    def page_cache_write(self) -> None:
        with open(self.new_file(), "wb", buffering=0) as f:
            f.write(self._raw)

    def torch_save(self) -> None:
        """As DCP's FileSystemWriter writes a file: torch.save, then flush and fsync (sync_files=True, its default).
        The fsync's writeback runs in the caller and is part of what the writer costs."""
        with open(self.new_file(), "wb") as f:
            self._torch_save(self._source, f)
            f.flush()
            os.fsync(f.fileno())

    def direct_write(self) -> None:
        path = self.new_file()
        try:
            self._write_direct(path, [self._raw], fsync=False)
        except self._unsupported:  # no O_DIRECT here: ckptio writes buffered, and so costs a page-cache write
            self.page_cache_write()


_SOAK_CHUNK = 64 << 20
_SOAK_CAP = 8 << 30
"""At most this much (and a third of ``MemAvailable``) is written to spend the pool of freed page-cache pages."""


def _take_freed_page_cache(new_file: Callable[[], str], *, cold_below: float, chunk: int = _SOAK_CHUNK,
                           cap: float | None = None) -> int:
    """Write ``chunk``-byte files (the caller removes them) into the page cache until two in a row write slower
    than ``cold_below`` bytes per CPU-second, or ``cap`` bytes (default: :data:`_SOAK_CAP`, at most a third of
    the memory available), or the disk is full; returns the bytes written.

    Why: on a VM, page-cache pages freed a moment ago (a process's files deleted, a checkpoint pruned) are handed
    out again first and are still backed by the hypervisor, so writes into them cost a fraction of writes into
    pages it must back again. A save's files keep growing the page cache, and meet the cold rate once that pool is
    spent: a cost probe that read the warm rate would under-predict every buffered mode. Anonymous memory does not
    spend that pool, so only page-cache writes can. ``cold_below`` is half the rate of copying into fresh anonymous
    memory (its page faults are of the same kind as the page cache's): pages the hypervisor backs anew cost several
    times that; on bare metal no chunk is that slow and the cap ends it. (The figures behind each sentence are in
    docs/planning-measurements.md.)
    """
    if cap is None:
        cap = min(_SOAK_CAP, (memory_available() or 0.0) / 3)
    data = memoryview(bytes(chunk))
    written = cold_in_a_row = 0
    while written < cap and cold_in_a_row < 2:
        try:
            with open(new_file(), "wb", buffering=0) as f:
                began = time.thread_time()
                f.write(data)
                seconds = time.thread_time() - began
        except OSError:  # a full disk: measure with what was spent
            break
        written += chunk
        cold_in_a_row = cold_in_a_row + 1 if chunk / max(seconds, 1e-9) < cold_below else 0
    return written


def _median_cpu_seconds(fn: object) -> float:
    """The median, not the best: work that allocates memory costs what the host's memory state makes it (pages
    freed a moment ago are cheap to take again, pages the hypervisor reclaimed are not), and a save meets the
    typical state, not the luckiest one."""
    assert callable(fn)
    fn()  # warm-up: first touch, allocator and file growth
    times = []
    for _ in range(_COST_REPEATS):
        began = time.thread_time()
        fn()
        times.append(time.thread_time() - began)
    return max(statistics.median(times), 1e-9)
