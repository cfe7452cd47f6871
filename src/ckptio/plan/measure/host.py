"""Host-side costs of a save: how fast the ckptio writers of one node serialize, all of them at once.

Owns the measurement behind the profile's ``serialize_bytes_per_s``. Before the store sees a byte, a writer
frames each staged tensor as ``torch.save`` bytes (:class:`ckptio.format.serialize.TensorFramer`) and checksums them
(:func:`ckptio.format.checksum`): CPU work, done by the writers of one node at the same time, each in its own
process. So it is measured with the writer's own code, the same way: ``writers`` forked processes start
together, warm the framing cache as a first save would, and each reports its steady-state rate. The framer
changes a process-wide torch setting, so it only ever runs in the children. Must never leave a child behind:
children that do not answer within the time bound are killed, and an interrupt kills them too.

It also measures the inputs of the background-cost model (:mod:`ckptio.plan.costs.background`): the per-byte CPU costs
of
each piece of work a save does (:func:`measure_writer_costs`), the kernel's write-back threshold
(:func:`dirty_background_bytes`), and how much a training step slows while a fresh copy of its state is alive
(:func:`measure_fresh_copy_drag`, which runs the caller's own step), what a trial save of the job's own saver
costs that step (:func:`measure_save_loss`, the same way). The local disk beneath a paced store is
:mod:`ckptio.plan.measure.disk`'s.
"""

from __future__ import annotations

import io
import os
import select
import signal
import statistics
import struct
import time
import warnings
from collections.abc import Callable, Mapping

from ckptio.errors import ConfigError, StorageError

_REPEATS = 3
_RATE = struct.Struct("d")


def serialize_once(tensor: object) -> float:
    """Bytes/s of the writer's framing plus checksum of ``tensor``, steady state (median of three).

    Runs in a child process only: the framer turns torch.save's zip CRC off for the whole process.
    """
    import torch

    from ckptio.format import checksum
    from ckptio.format.serialize import TensorFramer

    assert isinstance(tensor, torch.Tensor)
    raw = tensor.numpy().data.cast("B")
    framer = TensorFramer()
    dtype, shape = str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)
    framer.frame(dtype, shape, raw)  # the first save of a shape builds and caches the framing
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        checksum(framer.frame(dtype, shape, raw))
        times.append(time.perf_counter() - start)
    return raw.nbytes / max(statistics.median(times), 1e-9)


def serialize_bytes_per_s(nbytes: int, *, writers: int = 1, timeout_s: float = 30.0) -> float:
    """Per-writer serialize rate with ``writers`` writers serializing ``nbytes`` each at the same time."""
    import torch

    import ckptio.format
    import ckptio.format.serialize  # noqa: F401 - imported once here, not in every child

    tensor = torch.ones(max(nbytes // 4, 1))
    # A first torch.save in this process pays its one-time set-up here rather than in every child.
    torch.save(torch.ones(1), io.BytesIO())
    children: dict[int, int] = {}  # pid → read end of its pipe
    go_read, go_write = os.pipe()
    try:
        for _ in range(writers):
            pid, fd = _fork_child(tensor, go_read)
            children[pid] = fd
        os.write(go_write, b"x" * writers)  # one byte each: they start together
        rates = _collect(list(children.values()), time.monotonic() + timeout_s)
    finally:
        for fd in (go_read, go_write, *children.values()):
            os.close(fd)
        _reap(list(children))
    if not rates:
        raise StorageError(f"no writer of the serialize measurement answered within {timeout_s:g} s")
    return statistics.median(rates)


def _fork_child(tensor: object, go_read: int) -> tuple[int, int]:
    result_read, result_write = os.pipe()
    with warnings.catch_warnings():
        # The parent may hold idle helper threads; the child only computes and writes one pipe, then _exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(result_read)
            os.read(go_read, 1)
            os.write(result_write, _RATE.pack(serialize_once(tensor)))
            code = 0
        finally:
            os._exit(code)
    os.close(result_write)
    return pid, result_read


def _collect(fds: list[int], deadline: float) -> list[float]:
    rates, waiting = [], list(fds)
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(waiting, [], [], left)
        for fd in ready:
            data = os.read(fd, _RATE.size)
            if len(data) == _RATE.size:
                rates.append(_RATE.unpack(data)[0])
            waiting.remove(fd)
    return rates


def _reap(pids: list[int]) -> None:
    for pid in pids:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:
            continue


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


def dirty_background_bytes(vm_dir: str = "/proc/sys/vm", meminfo: str = "/proc/meminfo") -> float | None:
    """Dirty page-cache bytes past which this host's kernel starts writing back (the whole host's: divide by the
    ranks that write at once). ``vm.dirty_background_bytes`` when set, else ``vm.dirty_background_ratio`` % of
    the memory that can hold dirty pages, taken as ``MemAvailable``. None where it cannot be read (not Linux)."""
    try:
        with open(os.path.join(vm_dir, "dirty_background_bytes"), encoding="ascii") as f:
            fixed = int(f.read())
        if fixed > 0:
            return float(fixed)
        with open(os.path.join(vm_dir, "dirty_background_ratio"), encoding="ascii") as f:
            ratio = int(f.read())
    except (OSError, ValueError):
        return None
    available = memory_available(meminfo)
    return None if available is None else ratio / 100.0 * available


def memory_available(meminfo: str = "/proc/meminfo") -> float | None:
    """``MemAvailable`` in bytes: what the kernel can hand out without swapping. None where it cannot be read."""
    try:
        with open(meminfo, encoding="ascii") as f:
            return float(next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")))
    except (OSError, ValueError, StopIteration):
        return None


_COST_PROBE_BYTES = 32 << 20
_COST_REPEATS = 5


def measure_writer_costs(nbytes: int = _COST_PROBE_BYTES, *, directory: str | None = None) -> dict[str, float]:
    """Bytes per CPU-second of one core for each piece of work a save does on this host (single thread).

    Keys are :class:`ckptio.plan.costs.background.WriterCosts`'s fields. Each figure is CPU time of the calling thread
    (``time.thread_time``: user and kernel, page faults included), so other processes' load on a shared host
    slows the wall clock but not the figure; the median of a few repeats. ``directory`` holds the file sinks
    (default: the temp dir); they are removed. Every write goes to a new file kept until the end, as every save
    writes new files: the page cache grows, and its page allocation is part of the cost (on a VM whose free
    memory goes back to the hypervisor it is most of it). Runs in this process: ``torch.save`` here keeps torch's
    zip CRC on, as DCP's writer does. Before the writes into files it spends the pool of page-cache pages freed a
    moment ago, which a VM hands out several times cheaper than the pages a save's files meet
    (:func:`_take_freed_page_cache`: up to 8 GiB written, removed with the rest).
    """
    import tempfile

    import crc32c
    import torch

    from ckptio.storage.direct_io import DirectIOUnsupported, write_direct

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the writers and the staging copies each run on one thread
    source = torch.rand(max(nbytes // 4, 1))
    target = torch.empty_like(source).copy_(source)  # touched: a reused staging slot
    raw = source.numpy().data.cast("B")
    try:
        with tempfile.TemporaryDirectory(dir=directory, prefix=".ckptio-costs-") as sinks:
            names = iter(range(1 << 30))

            def new_file() -> str:
                return os.path.join(sinks, str(next(names)))

            def page_cache_write() -> None:
                with open(new_file(), "wb", buffering=0) as f:
                    f.write(raw)

            def torch_save() -> None:
                # As DCP's FileSystemWriter writes a file: torch.save, then flush and fsync (sync_files=True, its
                # default). The fsync's writeback runs in the caller and is part of what the writer costs.
                with open(new_file(), "wb") as f:
                    torch.save(source, f)
                    f.flush()
                    os.fsync(f.fileno())

            def direct_write() -> None:
                path = new_file()
                try:
                    write_direct(path, [raw], fsync=False)
                except DirectIOUnsupported:  # no O_DIRECT here: ckptio writes buffered, and so costs a page-cache write
                    page_cache_write()

            in_memory = {
                "copy_bytes_per_s": lambda: target.copy_(source),
                "fresh_copy_bytes_per_s": lambda: torch.empty_like(source).copy_(source),
                "checksum_bytes_per_s": lambda: crc32c.crc32c(raw),
            }
            rates = {name: raw.nbytes / _median_cpu_seconds(fn) for name, fn in in_memory.items()}
            _take_freed_page_cache(new_file, cold_below=rates["fresh_copy_bytes_per_s"] / 2)
            to_files = {
                "page_cache_bytes_per_s": page_cache_write,
                "torch_save_bytes_per_s": torch_save,
                "direct_write_bytes_per_s": direct_write,
            }
            return rates | {name: raw.nbytes / _median_cpu_seconds(fn) for name, fn in to_files.items()}
    finally:
        torch.set_num_threads(threads)


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
    pages it must back again (2026-12-05 VM: 4,600 MiB per CPU-second for the first 1.6 GiB written after 2 GiB of
    files were deleted, then 380, as into memory never touched). A save's files keep growing the page cache, and
    meet the cold rate once that pool is spent; a cost probe right after a deletion read the warm one, and the
    planner under-predicted every buffered mode 3× (bench_fsdp run after bench_planner). Anonymous memory does not
    spend that pool: touching 3 GiB of it left the next page-cache writes as cheap. ``cold_below`` is half the rate
    of copying into fresh anonymous memory (its page faults are of the same kind as the page cache's): pages the
    hypervisor backs anew cost several times that; on bare metal no chunk is that slow and the cap ends it.
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


def _step_seconds(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


def _timed_steps(step: Callable[[], object], count: int) -> list[float]:
    return [_step_seconds(step) for _ in range(count)]


def measure_fresh_copy_drag(step: Callable[[], object], state: Callable[[], Mapping[str, object]], *,
                            steps: int = 4, repeats: int = 2, steady_heap: bool = False) -> float:
    """How much slower the caller's training step runs while a freshly allocated copy of its state is alive:
    mean step time with the copy ÷ without, − 1, floored at 0 (:attr:`ckptio.plan.costs.background.HostModel.
    fresh_copy_drag`).

    Runs ``steps`` clean steps, allocates the copy as default ``async_save``'s stager does (new memory for every
    tensor of ``state()``, a DTensor's local shard), runs ``steps`` steps with it alive, frees it, and runs
    ``steps`` clean steps again: the two clean runs bracket the live one, so a drift of the step time over the
    measurement cancels; ``repeats`` times (a CPU step moves by ±10 % on its own, the drag is of that order).
    Call it on every rank of a job whose steps wait for each other, at the same point. The copy's own cost (the
    blocking part of such a save) is not in the figure. ``steady_heap``: the caller's process never trims its heap
    (glibc's ``MALLOC_TRIM_THRESHOLD_`` set high, as bench_planner's ranks): the first copy's drag is then set-up,
    paid once, and ``steps`` untimed steps with a first copy alive come before the runs.
    """
    import torch

    def fresh_copy(value: object) -> object:
        if isinstance(value, Mapping):
            return {k: fresh_copy(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [fresh_copy(v) for v in value]
        if isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            return torch.empty_like(local).copy_(local)
        return value

    if steps < 1 or repeats < 1:
        raise ConfigError(f"steps and repeats must be >= 1, got {steps} and {repeats}")
    if steady_heap:
        # The first copy takes the memory the steps were recycling, and they grow their heap; one never trimmed
        # keeps that growth, so the saves after the first meet no drag from it (bench_planner's ranks, scratch: the
        # first copy's steps 108-120 ms with 2,458-3,277 page faults each against 74-76 clean; every later copy's
        # 66-88 ms, no fault). A trimmed heap grows again at every copy: the demo's drag read 1-2 % with this
        # warm-up against 3-12 % without, and its default async_save then came out under.
        with torch.no_grad():
            first = fresh_copy(state())
        _timed_steps(step, steps)
        del first
    clean: list[float] = []
    live: list[float] = []
    for _ in range(repeats):
        clean += _timed_steps(step, steps)
        with torch.no_grad():
            copy = fresh_copy(state())
        live += _timed_steps(step, steps)
        del copy
        clean += _timed_steps(step, steps)
    mean_clean = statistics.fmean(clean)
    return max(0.0, statistics.fmean(live) / mean_clean - 1.0) if mean_clean > 0 else 0.0


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank of the default ``torch.distributed`` process group (an all-reduce): how
    ranks that wait for each other agree to keep stepping while any of them still measures (the ``any_writing``
    of :func:`measure_save_loss`)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def measure_save_loss(step: Callable[[], object], save: Callable[[int], Callable[[], bool]], *, steps: int = 12,
                      repeats: int = 8, any_writing: Callable[[bool], bool] | None = None,
                      every: int | None = None) -> float:
    """Training seconds one save of the job's own saver costs its steps, on the job's own ranks and store: the
    time the call that starts it holds the loop, plus Σ (step begun while it is in flight − the round's mean
    clean step), the mean of ``repeats`` saves. The planner takes from it what its model cannot derive from
    per-byte CPU costs (:func:`ckptio.plan.costs.calibration.excess_from_trial`).

    ``save(index)`` starts save ``index`` (1, 2, …: fresh step numbers on a scratch root) and returns a poll that
    says whether it is done (durable); ``step`` is one training step, with whatever the saver asks of it before
    the optimizer mutates the state. Each save runs between runs of ``steps`` clean steps that bracket it (each
    run closes one round and opens the next), so that a drift of the step time over the measurement cancels. A
    save's cost outlives its durability by a few steps (on a 2-vCPU VM the steps after an ``O_DIRECT`` save is
    durable run 10–40 % slow and settle over ~5 steps): brackets of 4 steps counted that tail as clean and read
    half what the same saves cost a job saving every 30 steps, hence at least 12. ``every``, the job's interval
    in steps: each round then takes that many steps (its clean run after the save has ``every`` − the steps in
    flight, never fewer than ``steps``), as the job's own rounds do, so that the tail weighs as much in the
    trial's clean mean as in the job's. With 12-step runs in a job saving every 30 steps it weighed nearly twice
    as much (bench_planner, three runs: against steps long after the save, the clean mean took 40–70 ms per save
    off the trial's figure and 10–40 off the job's), and the trial read less than the job lost. Warm the saver
    up first (its first save boots its writer and allocates its staging memory): the figure is a steady save's.

    A job whose ranks wait for each other calls it on every rank at the same point with ``any_writing``
    (:func:`any_rank`): given whether this rank's save is still in flight it says whether any rank's is, so that
    every rank runs as many steps and none waits forever for a peer that stopped stepping; it also lines the
    ranks up before each save. A save that raises (a full disk) is raised again once every round has run, so that
    a rank whose save failed keeps stepping in lockstep with its peers instead of leaving them in a collective.
    """
    if steps < 1 or repeats < 1 or (every is not None and every < 1):
        raise ConfigError(f"steps, repeats and every must be >= 1, got {steps}, {repeats} and {every}")
    agree = any_writing or (lambda writing: writing)
    lost = 0.0
    failures: list[Exception] = []
    before = _timed_steps(step, steps)
    for index in range(1, repeats + 1):
        agree(False)  # the ranks start their saves together
        began = time.perf_counter()
        try:
            done = save(index)
        except Exception as exc:  # raised after the last round: peers in lockstep take as many steps
            failures.append(exc)
            done = _nothing_in_flight
        blocking = time.perf_counter() - began
        live = []
        while agree(not done()):
            live.append(_step_seconds(step))
        # Every rank stepped as many live steps (they agreed at each), so every rank runs as many clean ones.
        after = _timed_steps(step, max(steps, (every or 0) - len(live)))
        clean = statistics.fmean(before + after)
        before = after
        lost += blocking + sum(live) - clean * len(live)
    if failures:
        raise failures[0]
    return lost / repeats


def _nothing_in_flight() -> bool:
    return True
