"""Host-side costs of a save: how fast the ckptio writers of one node serialize, all of them at once.

Owns the measurement behind the profile's ``serialize_bytes_per_s``. Before the store sees a byte, a writer
frames each staged tensor as ``torch.save`` bytes (:class:`ckptio.format.serialize.TensorFramer`) and checksums them
(:func:`ckptio.format.checksum`): CPU work, done by the writers of one node at the same time, each in its own
process. So it is measured with the writer's own code, the same way: ``writers`` forked processes start
together, warm the framing cache as a first save would, and each reports its steady-state rate. The framer
changes a process-wide torch setting, so it only ever runs in the children. Must never leave a child behind:
children that do not answer within the time bound are killed, and an interrupt kills them too.

It also measures the inputs of the background-cost model (:mod:`ckptio.plan.background`): the per-byte CPU costs of
each piece of work a save does (:func:`measure_writer_costs`), the kernel's write-back threshold
(:func:`dirty_background_bytes`), and how much a training step slows while a fresh copy of its state is alive
(:func:`measure_fresh_copy_drag`, which runs the caller's own step), and what the store's ``O_DIRECT`` writes cost
that step beyond the writer's CPU (:func:`measure_direct_io_collateral`, the same way).
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import statistics
import struct
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ckptio._proc import child_env
from ckptio.errors import ConfigError, StorageError
from ckptio.plan.background import CKPTIO_WRITER_NICE, GIB

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
        with open(meminfo, encoding="ascii") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, StopIteration):
        return None
    return ratio / 100.0 * available


_COST_PROBE_BYTES = 32 << 20
_COST_REPEATS = 5


def measure_writer_costs(nbytes: int = _COST_PROBE_BYTES, *, directory: str | None = None) -> dict[str, float]:
    """Bytes per CPU-second of one core for each piece of work a save does on this host (single thread).

    Keys are :class:`ckptio.plan.background.WriterCosts`'s fields. Each figure is CPU time of the calling thread
    (``time.thread_time``: user and kernel, page faults included), so other processes' load on a shared host
    slows the wall clock but not the figure; the median of a few repeats. ``directory`` holds the file sinks
    (default: the temp dir); they are removed. Every write goes to a new file kept until the end, as every save
    writes new files: the page cache grows, and its page allocation is part of the cost (on a VM whose free
    memory goes back to the hypervisor it is most of it). Runs in this process: ``torch.save`` here keeps torch's
    zip CRC on, as DCP's writer does.
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

            work = {
                "copy_bytes_per_s": lambda: target.copy_(source),
                "fresh_copy_bytes_per_s": lambda: torch.empty_like(source).copy_(source),
                "checksum_bytes_per_s": lambda: crc32c.crc32c(raw),
                "page_cache_bytes_per_s": page_cache_write,
                "torch_save_bytes_per_s": torch_save,
                "direct_write_bytes_per_s": direct_write,
            }
            return {name: raw.nbytes / _median_cpu_seconds(fn) for name, fn in work.items()}
    finally:
        torch.set_num_threads(threads)


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
                            steps: int = 4, repeats: int = 2) -> float:
    """How much slower the caller's training step runs while a freshly allocated copy of its state is alive:
    mean step time with the copy ÷ without, − 1, floored at 0 (:attr:`ckptio.plan.background.HostModel.
    fresh_copy_drag`).

    Runs ``steps`` clean steps, allocates the copy as default ``async_save``'s stager does (new memory for every
    tensor of ``state()``, a DTensor's local shard), runs ``steps`` steps with it alive, frees it, and runs
    ``steps`` clean steps again: the two clean runs bracket the live one, so a drift of the step time over the
    measurement cancels; ``repeats`` times (a CPU step moves by ±10 % on its own, the drag is of that order).
    Call it on every rank of a job whose steps wait for each other, at the same point. The copy's own cost (the
    blocking part of such a save) is not in the figure.
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
    of :func:`measure_direct_io_collateral`)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def measure_direct_io_collateral(step: Callable[[], object], directory: str, nbytes: int, *, steps: int = 4,
                                 repeats: int = 8, any_writing: Callable[[bool], bool] | None = None,
                                 writer_nice: int = CKPTIO_WRITER_NICE) -> float:
    """Training seconds lost per GiB that ckptio's writer moves to ``directory`` with ``O_DIRECT``, beyond the
    writer's own CPU (:attr:`ckptio.plan.background.HostModel.direct_io_s_per_gib`); 0 where the filesystem
    refuses ``O_DIRECT`` (ckptio writes buffered there).

    Each of ``repeats`` rounds steps while a process standing in for ckptio's writer (:mod:`ckptio.plan.io_load`:
    a fresh interpreter at the writer's ``writer_nice`` and I/O class) writes ``nbytes`` into a new file of
    ``directory`` with ckptio's own ``O_DIRECT`` path and fsyncs it, until the write is done, between runs of
    ``steps`` clean steps (each run brackets the rounds before and after it, as in
    :func:`measure_fresh_copy_drag`). The figure is Σ (live step − mean of the round's clean steps) − the
    process's CPU time for the write, over all rounds' bytes: what the device's I/O costs the steps on top of the
    CPU the model already charges the writer. On a VM this is the hypervisor's emulation of the disk and the
    interrupts it raises, which land on the vCPUs training runs on (measured on a 2-vCPU VM: 0.1–0.3 s per
    128 MiB; none on earlier ones). Rounds vary widely with the host's own load (from nothing to 2–3 s/GiB within
    one run there, both ranks alike), hence eight by default. The stand-in is a process, not a thread of the
    caller's, because the writer is one: a thread shares the trainer's interpreter lock and process (in the FSDP2
    loop of ``bench/bench_fsdp.py`` a thread read 1.53 and 1.95 s/GiB in runs whose saves showed ~0.2). Its
    priority matters as much: at nice 0 a thread read 1.26–1.63 s/GiB where nice 10 read 0.75–1.08 (alternating
    runs of the demo's ranks); a nice-0 writer preempts training at every completion, a niced one waits.

    A job whose ranks wait for each other must call it on every rank at the same point, and pass ``any_writing``:
    given whether this rank's write is still going, it returns whether any rank's is (an all-reduce), so that
    every rank runs as many steps and none waits forever for a peer that stopped stepping; it also lines the ranks
    up once every rank's stand-in is ready. The files are removed at the end. A write that fails (a full disk),
    a stand-in that does not start or one that outlives :func:`_io_load_deadline_s` (killed) raises
    :class:`~ckptio.errors.StorageError` after the last round.
    """
    import tempfile

    if steps < 1 or repeats < 1 or nbytes < 1:
        raise ConfigError(f"steps, repeats and nbytes must be >= 1, got {steps}, {repeats} and {nbytes}")
    if not os.path.isdir(directory):
        raise ConfigError(f"the O_DIRECT measurement needs an existing directory on the store, got {directory!r}")
    agree = any_writing or (lambda writing: writing)

    lost = 0.0
    unsupported = False
    failures: list[str] = []
    with tempfile.TemporaryDirectory(dir=directory, prefix=".ckptio-io-") as sinks:
        before = _timed_steps(step, steps)
        for index in range(repeats):
            load = _IoLoad(os.path.join(sinks, str(index)), nbytes, writer_nice)
            try:
                agree(False)  # every rank's stand-in is ready: the live steps start together
                load.go()
                live = []
                while agree(load.running()):  # every rank steps until the last rank's write ends
                    live.append(_step_seconds(step))
                outcome = load.outcome()
            finally:
                load.kill()
            after = _timed_steps(step, steps)  # this round's closing bracket, the next round's opening one
            clean = statistics.fmean(before + after)
            before = after
            if isinstance(outcome, str):  # raised once every round has run: peers in lockstep take as many steps
                failures.append(outcome)
                continue
            unsupported = unsupported or bool(outcome["unsupported"])
            lost += sum(live) - clean * len(live) - float(outcome["cpu_s"])
    if failures:
        raise StorageError(f"the O_DIRECT measurement could not write into {directory}: {failures[0]}")
    if unsupported:
        return 0.0
    return max(0.0, lost / (repeats * nbytes / GIB))


def _io_load_deadline_s(nbytes: int) -> float:
    """How long a stand-in write may take before it is killed: a minute, plus its bytes at 1 MiB/s."""
    return 60.0 + nbytes / (1 << 20)


class _IoLoad:
    """One :mod:`ckptio.plan.io_load` process: started and ready on construction (or failed: no process)."""

    def __init__(self, path: str, nbytes: int, nice: int) -> None:
        import subprocess

        self.failure: str | None = None
        self._deadline = float("inf")
        self._limit_s = _io_load_deadline_s(nbytes)
        try:
            self._proc: subprocess.Popen[str] | None = subprocess.Popen(
                [sys.executable, "-m", "ckptio.plan.io_load", path, str(nbytes), str(nice)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
        except OSError as exc:
            self._proc, self.failure = None, f"the stand-in writer did not start: {exc}"
            return
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            self.kill()
            self.failure = f"the stand-in writer exited before it was ready (exit code {self._proc.returncode})"
            self._proc = None

    def go(self) -> None:
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.write("go\n")
        self._proc.stdin.flush()
        self._deadline = time.monotonic() + self._limit_s

    def running(self) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            return False
        if time.monotonic() > self._deadline:
            self.kill()
            self.failure = f"the stand-in writer's {self._limit_s:.0f} s for its write ran out (killed)"
            return False
        return True

    def outcome(self) -> dict[str, Any] | str:
        """Its JSON line, or why there is none."""
        if self._proc is None or self.failure is not None:
            return self.failure or "no stand-in writer"
        out, _ = self._proc.communicate(timeout=30)
        try:
            outcome = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return f"the stand-in writer exited with code {self._proc.returncode} and no outcome"
        return str(outcome["error"]) if outcome.get("error") else outcome

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait()

