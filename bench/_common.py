"""The one helper module of the benchmarks: states, median-of-reps timing, fio, RSS sampling, event-log
summaries, the RATIOS line, the one-rank process group DCP's strongest async path needs (that path itself,
DCP-best, the anchor every save benchmark measures next to ``dcp.save`` and default ``dcp.async_save``, is
:class:`ckptio.demo.dcp_best.DcpBest`, the demo's too), and a small real multi-rank ckptio job (``run_job``) for
the planner and simulator benchmarks.

Every benchmark measures its anchor and ckptio in the same run: on a shared, noisy machine only a ratio measured
in one run means something. This module never asserts a goal: the scripts print figures and one ``RATIOS`` line
and let the reader judge.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptio.obs.eventfiles import load_events, read_event_file
from ckptio.plan.costs.calibration import prediction_error

MiB = 1 << 20
GiB = 1 << 30


def quiet_dcp() -> None:
    """DCP warns on every single-process save (no process group) and about storage details; silence that."""
    warnings.filterwarnings("ignore")
    for name in ("torch.distributed.checkpoint", "torch.distributed", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)


def make_state(big: int, big_mib: int, tiny: int, *, seed: int = 0) -> dict[str, Any]:
    """``big`` fp32 tensors of ``big_mib`` MiB each plus ``tiny`` 16-element tensors (the issue's state shape)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    numel = big_mib * MiB // 4
    state: dict[str, Any] = {f"big.{i}": torch.rand(numel, generator=gen) for i in range(big)}
    state.update({f"tiny.{i}": torch.rand(16, generator=gen) for i in range(tiny)})
    return state


def state_bytes(state: Any) -> int:
    """Bytes of every tensor in a nested state (dicts, lists, tuples) that this rank holds (a DTensor's local
    shard)."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.to_local().nbytes if hasattr(state, "to_local") else state.nbytes
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(run: Callable[[int], Any], reps: int, *, warmup: int = 1,
                after: Callable[[int], Any] | None = None) -> tuple[float, list[float]]:
    """Median wall time of ``run(rep)`` over ``reps`` after ``warmup`` untimed calls.

    ``after(rep)`` runs untimed after each call (e.g. wait for a background flush so the next rep measures
    staging, not queueing behind the previous save).
    """
    times = []
    for rep in range(-warmup, reps):
        t0 = time.perf_counter()
        run(rep)
        dt = time.perf_counter() - t0
        if after is not None:
            after(rep)
        if rep >= 0:
            times.append(dt)
    return statistics.median(times), times


def fmt_times(times: list[float]) -> str:
    return "[" + ", ".join(f"{t * 1e3:.0f}" for t in times) + "] ms"


def thread_schedstat() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of the calling thread (Linux schedstat)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            on_cpu, waiting = f.read().split()[:2]
    except OSError:
        return 0.0, 0.0
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def _cpu_line() -> list[int]:
    """The host's ``cpu`` line of ``/proc/stat`` in clock ticks: user nice system idle iowait irq softirq steal;
    empty where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def host_cpu() -> tuple[float, float]:
    """(busy, idle) CPU-seconds of the whole host since boot, every core together (``/proc/stat``; steal counts
    as neither): with each child process's CPU, where a save's work went beyond the trainer's own process."""
    ticks = _cpu_line()
    if len(ticks) < 7:
        return 0.0, 0.0
    user, nice, system, idle, iowait, irq, softirq = ticks[:7]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, (idle + iowait) / tick


def host_steal() -> float:
    """Seconds since boot the hypervisor ran something else while the host's vCPUs had work (``/proc/stat``
    steal, every core together; 0 on bare metal): on a VM the store's I/O is emulated on the cores the vCPUs run
    on, and a vCPU that is stolen from runs neither training nor the writer."""
    ticks = _cpu_line()
    return ticks[7] / os.sysconf("SC_CLK_TCK") if len(ticks) >= 8 else 0.0


def children_cpu() -> float:
    """CPU-seconds of the calling process's live child processes (DCP's checkpoint process, ckptio's writer)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def thread_stats() -> dict[str, list[float]]:
    """Per thread name of the calling process: [CPU s, run-queue wait s, system CPU s, minor page faults] since each
    thread started (``/proc/self/task``); the calling thread is ``TRAIN``. Threads of one name add up (gloo starts
    several of each). Where a save's cost lands in the trainer's own process, beyond its writer."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    me = threading.get_native_id()
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, list[float]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                on_cpu, waiting = f.read().split()[:2]
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # fields from the 3rd: minflt is the 10th, stime the 15th
        name = "TRAIN" if int(tid) == me else names.get(int(tid), comm)
        row = out.setdefault(name, [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate((int(on_cpu) / 1e9, int(waiting) / 1e9, int(fields[12]) / tick, int(fields[7]))):
            row[i] += value
    return out


def thread_deltas(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, list[float]]:
    """``after - before`` per thread name; a name new since ``before`` counts from zero, one gone is left out."""
    return {name: [a - b for a, b in zip(values, before.get(name, [0.0] * len(values)), strict=True)]
            for name, values in after.items()}


def costs_line(costs: Any) -> str:
    """The planner's measured writer costs (``WriterCosts``), one line: the input a reader checks first when a
    prediction misses (they move with the host's memory state: see docs/planning.md)."""
    line = "writer costs (MiB per CPU-second): " + ", ".join(
        f"{k.removesuffix('_bytes_per_s')} {v / MiB:,.0f}" if k.endswith("_bytes_per_s") else f"{k} {v:,.0f}"
        for k, v in costs.to_json().items())
    print(line, flush=True)
    return line


def ratio_line(**ratios: float | str) -> str:
    """The one closing line every benchmark prints: ``RATIOS name=value ...``."""
    parts = [f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in ratios.items()]
    line = "RATIOS " + " ".join(parts)
    print(line, flush=True)
    return line


def standard_error(values: list[float]) -> float:
    """The standard error of ``values``' mean (0 for fewer than two): how far a mode's mean loss over its saves
    can be trusted, printed beside it."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


def prediction_check(rows: dict[str, tuple[float, float, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Issue 12's check: per mode ``(predicted s, measured s, seconds between saves)`` of time lost per save.
    Prints a table and the two closing lines (contract): ``RATIOS lost_<mode>=predicted ÷ measured`` and
    ``POINTS lost_<mode>=(predicted − measured) ÷ the time between saves × 100``. Goal: each within 0.8–1.2 or
    within ±3 points. Returns (ratios, points)."""
    print(f"{'mode':<10}{'predicted ms':>14}{'measured ms':>13}{'pred %':>9}{'meas %':>9}{'ratio':>8}{'points':>8}"
          "  goal")
    ratios, points = {}, {}
    for mode, (pred, meas, between) in rows.items():
        ratios[mode], points[mode], met = prediction_error(pred, meas, between)
        print(f"{mode:<10}{pred * 1e3:>14.1f}{meas * 1e3:>13.1f}{100 * pred / between:>9.1f}"
              f"{100 * meas / between:>9.1f}{ratios[mode]:>8.2f}{points[mode]:>+8.1f}  {'met' if met else 'MISSED'}")
    print("RATIOS " + " ".join(f"lost_{m}={ratios[m]:.3f}" for m in rows), flush=True)
    print("POINTS " + " ".join(f"lost_{m}={points[m]:+.2f}" for m in rows), flush=True)
    return ratios, points


def verdict(value: float, goal: float, *, at_most: bool) -> str:
    ok = value <= goal if at_most else value >= goal
    return f"{'meets' if ok else 'MISSES'} goal {'<=' if at_most else '>='} {goal:g}"


# ---- the process group DCP-best needs --------------------------------------------------------------------------
def ensure_process_group() -> None:
    """A one-rank gloo group for single-process benchmarks: DCP's checkpoint process needs one to start."""
    import torch.distributed as dist

    from ckptio.testing.ranks import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if not dist.is_initialized():
        store = dist.TCPStore("127.0.0.1", free_port(), world_size=1, is_master=True)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


# ---- directories and fio ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def scratch_dir(parent: str | None, prefix: str) -> Iterator[Path]:
    """A fresh directory on the disk under test, removed afterwards."""
    base = parent or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def device_of(path: str | os.PathLike[str]) -> str:
    """The filesystem source behind ``path`` (what ``df`` prints), for the report header."""
    out = subprocess.run(["df", "--output=source,fstype", os.fspath(path)], check=False,
                         capture_output=True, text=True)
    lines = out.stdout.split("\n")
    return " ".join(lines[1].split()) if len(lines) > 1 else "?"


def drop_written(path: str | os.PathLike[str]) -> None:
    """Remove what a rep wrote so the next rep starts from an empty directory (same as fio's fresh files)."""
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def fio_write(directory: str | os.PathLike[str], nbytes: int, *, numjobs: int = 1, bs: str = "16M") -> float:
    """Sequential write with a final fsync (the flush anchor); returns MiB/s summed over jobs, from fio's JSON."""
    if shutil.which("fio") is None:
        sys.exit("fio not found: run `make sysdeps` (apt-get install -y fio)")
    cmd = ["fio", "--name=w", "--rw=write", f"--bs={bs}", "--end_fsync=1", f"--size={nbytes // numjobs}",
           f"--numjobs={numjobs}", f"--directory={os.fspath(directory)}", "--group_reporting",
           "--output-format=json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    # fio may print warnings before the JSON document.
    doc = json.loads(out.stdout[out.stdout.index("{"):])
    job = doc["jobs"][0]["write"]
    # bw_bytes is bytes / runtime where runtime includes the end fsync (end_fsync is part of the job).
    return float(job["bw_bytes"]) / MiB


def renice_writers(niceness: int) -> list[int]:
    """Diagnosis only: lower the CPU priority of this process's children (ckptio's writer processes).

    Lets a benchmark measure what running the writer at a lower priority would change, without touching the engine.
    """
    import psutil

    pids = []
    for child in psutil.Process().children(recursive=True):
        child.nice(niceness)
        pids.append(child.pid)
    return pids


# ---- RSS sampling ----------------------------------------------------------------------------------------------
class RssSampler:
    """Samples this process's RSS every ``interval_s`` in a thread; ``peak`` is the highest seen."""

    def __init__(self, interval_s: float = 0.005) -> None:
        import psutil

        self._proc = psutil.Process()
        self.interval_s = interval_s
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def now(self) -> int:
        return int(self._proc.memory_info().rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All event records of a run's per-rank files (``run/events.jsonl`` finds ``run/events.rank*.jsonl``), read
    by ckptio's own reader so a benchmark sees exactly what ``ckptio report`` sees."""
    return load_events(str(path))


def phase_summary(events: list[dict[str, Any]], step: int) -> str:
    """Per-phase seconds of one step from the writer's events (summed over files), for diagnosing a miss."""
    sums: dict[str, float] = {}
    for e in events:
        if e.get("step") == step and e.get("event") == "phase":
            sums[e["phase"]] = sums.get(e["phase"], 0.0) + float(e["seconds"])
        elif e.get("step") == step and e.get("event") in ("stage_end", "committed", "save_returned"):
            key = {"stage_end": "stage", "committed": "flush_total", "save_returned": "blocking"}[e["event"]]
            sums[key] = float(e.get("seconds", e.get("flush_s", e.get("blocking_s", 0.0))))
    return " ".join(f"{k}={v:.3f}s" for k, v in sums.items())


# ------------------------------------------------------------------------------------------------------------
# A small real ckptio job for the planner and simulator benchmarks: N gloo ranks saving every interval.
#
# Each rank sleeps ``interval_s`` (its "compute"), saves a state of ``bytes_per_rank`` through a Checkpointer
# (block on a full slot), and logs events; the figures come back per save as the slowest rank saw them. The
# store is a directory, optionally behind a shared ckptio.testing.wrappers.ThrottledStorage budget.

_TENSORS_PER_RANK = 4
_PHASES = ("serialize", "upload", "manifest", "retention")
_FIGURES = ("blocking_s", "flush_s", "commit_s", "data_s", "lag_s", *_PHASES)


@dataclass(kw_only=True, slots=True)
class RunSpec:
    """The measured job."""

    ranks: int
    """gloo ranks."""
    bytes_per_rank: int
    """State bytes each rank saves."""
    saves: int
    """Timed saves (after one warm-up save that starts the writers)."""
    interval_s: float
    """Sleep ("compute") before each save."""
    root: str
    """Checkpoint directory."""
    events_dir: str
    """Where the per-rank event logs go."""
    throttle_bytes_per_s: float | None = None
    """Aggregate write budget of the store, shared by every writer; None writes at disk speed."""


def _train(rank: int, world_size: int, spec: RunSpec) -> None:
    import torch
    import torch.distributed as dist

    from ckptio import Checkpointer
    from ckptio.storage import PosixStorage
    from ckptio.testing.wrappers import ThrottledStorage

    root: Any = spec.root
    if spec.throttle_bytes_per_s:
        throttle_state = os.path.join(spec.events_dir, "throttle.state")
        root = ThrottledStorage(PosixStorage(spec.root), write_bytes_per_s=spec.throttle_bytes_per_s,
                                state_path=throttle_state)
    numel = spec.bytes_per_rank // 4 // _TENSORS_PER_RANK
    # Keys of their own per rank: plain tensors under one key would count as replicated, and DCP would
    # spread them over the ranks instead of having each rank write its own bytes.
    state = {f"r{rank}.t{i}": torch.full((numel,), float(rank + i)) for i in range(_TENSORS_PER_RANK)}
    events = os.path.join(spec.events_dir, "events.rank{rank}.jsonl")
    with Checkpointer(root=root, events_path=events, max_pending=1, overflow="block", keep_last=2) as ck:
        ck.save(0, state).wait()  # warm-up: writer booted, buffers allocated, plan cached
        dist.barrier()
        for index in range(1, spec.saves + 1):
            time.sleep(spec.interval_s)
            ck.save(index, state)
        ck.wait()


def run_job(spec: RunSpec) -> list[dict[str, float]]:
    """Run ``spec`` and return one dict of figures per timed save (see :func:`per_save_figures`)."""
    from ckptio.testing.ranks import run_ranks  # imports torch: only the scripts that start ranks pay for it

    os.makedirs(spec.events_dir, exist_ok=True)
    if spec.throttle_bytes_per_s:
        open(os.path.join(spec.events_dir, "throttle.state"), "wb").close()
    run_ranks(spec.ranks, _train, spec)
    return per_save_figures(spec.events_dir, spec.ranks)


def per_save_figures(events_dir: str, ranks: int) -> list[dict[str, float]]:
    """Per save, from the ranks' events (one host: monotonic clocks agree across processes):

    ``blocking_s`` (slowest rank), ``flush_s`` (slowest rank's ``committed.flush_s``, as ckptio reports it),
    ``commit_s`` (last ``save()`` return → the manifest written: the commit itself), ``data_s`` (last
    ``save()`` return → the last data file durable), ``lag_s``, and the writer phases ``serialize``,
    ``upload``, ``retention`` (summed over a rank's files, slowest rank).
    """
    saves: dict[int, dict[str, float]] = {}
    returned: dict[int, float] = {}
    committed_at: dict[int, float] = {}
    data_at: dict[int, float] = {}
    phases: dict[tuple[int, int, str], float] = {}
    for rank in range(ranks):
        for event in read_event_file(os.path.join(events_dir, f"events.rank{rank}.jsonl")):
            step, name = event.get("step"), event["event"]
            if not step:
                continue
            slot = saves.setdefault(step, dict.fromkeys(_FIGURES, 0.0))
            if name == "phase" and event.get("phase") in _PHASES:
                key = (rank, step, event["phase"])
                phases[key] = phases.get(key, 0.0) + event["seconds"]
                if event["phase"] == "manifest":
                    committed_at[step] = event["mono"]
                elif event["phase"] == "upload":
                    data_at[step] = max(data_at.get(step, 0.0), event["mono"])
            elif name == "save_returned":
                slot["blocking_s"] = max(slot["blocking_s"], event["blocking_s"])
                returned[step] = max(returned.get(step, 0.0), event["mono"])
            elif name == "committed" and event.get("role") == "trainer":
                slot["flush_s"] = max(slot["flush_s"], event["flush_s"])
                slot["lag_s"] = max(slot["lag_s"], event.get("lag_s") or 0.0)
    for (_, step, phase), seconds in phases.items():
        saves[step][phase] = max(saves[step][phase], seconds)
    for step, at in committed_at.items():
        saves[step]["commit_s"] = at - returned[step]
    for step, at in data_at.items():
        saves[step]["data_s"] = at - returned[step]
    return [saves[s] for s in sorted(saves)]


def median_figure(saves: list[dict[str, float]], key: str) -> float:
    """The median of one figure over the saves :func:`run_job` returned."""
    return statistics.median(s[key] for s in saves)


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """moto in its own process on a free port of 127.0.0.1, the AWS environment pointed at it; returns the server
    and its URL. Its own process: a server sharing the bench's GIL would slow the Python clients only."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    moto = Path(sys.executable).parent / "moto_server"
    server = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=url)
    return server, url
