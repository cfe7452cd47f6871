"""Planner truth: the time each save mode costs training, predicted by the planner, then measured.

The job: ``--ranks`` gloo ranks (one torch thread each), each training its own MLP with Adam and all-reducing
the loss every step (lockstep, like a job whose gradient sync runs on the accelerator fabric), saving its whole
state (weights + both Adam moments, ``--mib-per-rank``) every ``--every`` steps to a store throttled to
``--store-bandwidth`` shared by all ranks (:class:`~ckptio.testing.wrappers.ThrottledStorage`'s clock; DCP
writes through the demo's ``ThrottledFileSystemWriter`` on the same clock). Backing directory: ``--dir``
(default: the temp dir, on disk, fsync on, as the demo's store: each writer's page-cache and writeback costs are
part of what it costs the step).

The modes (:data:`ckptio.plan.costs.background.MODES`): ``dcp.save``; default ``dcp.async_save`` (one in flight, own
gloo group); DCP-best (PROCESS checkpointer, ``DefaultStager`` with shared memory and async staging; the loop
waits for ``staging_completion`` before ``optimizer.step`` and for the previous upload before the next save);
ckptio (``max_pending=1``, ``overflow="block"``).

The ranks run with glibc's heap trimming off and large buffers kept in the heap (``_STEADY_HEAP``;
``--glibc-trim`` leaves glibc's defaults): this CPU job frees its gradients and Adam temporaries every step, and
with glibc's defaults its clean steps alone flip between two speeds as the heap's top goes back to the kernel and
is faulted in again, which a GPU job's host, whose buffers live on the device, does not do. In such a heap
default ``async_save``'s per-save staging copy lands in memory the last save's copy touched: the prediction
charges it at the touched-memory copy rate (with ``--glibc-trim``, the fresh-memory one).

Prediction first, from measurements that never see a mode run: the writer's per-byte CPU costs on this host
(:func:`ckptio.plan.measure.writer_costs.measure_writer_costs`, in the store's directory), the store's bandwidth, the
host's cores per rank, training's CPU use (one thread: 1 core), how much slower its step runs while a fresh copy of its
state is alive (:func:`ckptio.plan.measure.training.measure_fresh_copy_drag`, on fresh ranks that never save: default
``async_save`` keeps such a copy until its write is done), and what a trial save of ckptio's own writer, and one of
DCP-best's (the buffered writer DCP's background modes share), every rank at once into a root of its own on the same
store, cost the steps beyond what the model charges them from their CPU costs
(:func:`ckptio.plan.measure.training.measure_save_loss`, on the same ranks;
:func:`ckptio.plan.costs.calibration.excess_from_trial`). Where a trial loses more than the model charges, that mode's
prediction is its trial's; default ``async_save``'s takes DCP-best's excess per GiB, a prediction across modes. Then
each mode runs, ckptio first (:func:`run_order`).

Measured time lost per save, per rank, averaged over ranks (they run in lockstep): the time ``save()`` (and, for
DCP-best, the staging wait) held the loop, plus Σ over steps that began while the save's flush ran of (step − mean
clean step); clean steps began with nothing in flight. Per mode it also prints the save's CPU while its flush ran
against the model's, and the host's steal over the in-flight steps beyond the clean steps' rate (``/proc/stat``:
on a VM the store's I/O is emulated on the vCPUs' cores; the model has it for ckptio's ``O_DIRECT`` path only).
Means, not medians: the other load of a shared host makes step times skewed, and a median-based excess would count
that skew as the save's cost.

Closing lines (contract): ``RATIOS lost_<mode>=predicted ÷ measured`` and ``POINTS lost_<mode>=(predicted −
measured) ÷ (every × clean step) × 100`` (percentage points of the training time between saves). Goal: each
within 0.8–1.2 or within ±3 points.

    .venv/bin/python bench/bench_planner.py [--ranks 2] [--mib-per-rank 192] [--every 40] [--saves 8] [--layers 4]

Eight timed saves per mode by default: over 3 a mode's loss carried standard errors up to 206 ms (default
``async_save`` read 384 ± 80 ms in a run where it missed by 3.4 points), over 8 of 2–45 ms. Each save more costs
one interval per mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    children_cpu,
    costs_line,
    host_steal,
    prediction_check,
    quiet_dcp,
    standard_error,
    thread_schedstat,
)
from ckptio.demo.dcp_best import DcpBest
from ckptio.plan.costs.background import MODES, ModeCost, predict_modes
from ckptio.plan.costs.calibration import excess_from_trial
from ckptio.plan.costs.inputs import Host, Workload, WriterCosts
from ckptio.plan.costs.store import StoreLimits, flush_times
from ckptio.plan.job.checkpoint import uniform_shape
from ckptio.plan.measure.disk import DiskRates, measure_disk, on_local_disk
from ckptio.plan.measure.training import any_rank, measure_fresh_copy_drag, measure_save_loss
from ckptio.plan.measure.writer_costs import measure_writer_costs

MIB = 1 << 20
_LAYERS = 4
"""Default ``--layers``: four square layers, 12 state items per rank (each weight and its two Adam moments). The
demo's transformer has 109; DCP-best pays per item as well as per byte (``WriterCosts.dcp_items_per_s``)."""
_CALIBRATE = "calibrate"
_DRAG_STEPS = 10
_STEADY_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 * MIB), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
"""glibc settings for the rank processes (``--glibc-trim`` leaves glibc's own): the stand-in job's steps free
their gradients and Adam temporaries on the host, and with glibc's trimming its clean steps alone flip between
~0 and ~20,000 page faults per step (55–60 ms against 85–95 ms on the 2-core dev VM, scratch per-step
``/proc/thread-self/stat`` counts), which makes the baseline a save is measured against bimodal. A GPU job's host
does not churn its heap that way; with large buffers kept in the heap and the heap never trimmed, the job stands
in for one. The fresh-copy drag a CPU job does show is measured, not switched off, in the demo and
``bench_fsdp.py`` (docs/planning.md, ``fresh_copy_drag``)."""
_SETTLE_S = 15.0
"""Seconds after deleting files before a measurement: on a VM, ``torch.save`` into the page cache costs 1,400–2,300
MiB per CPU-second right after a file of the same size was deleted and 300–350 a few seconds later (measured: 828–1,751
after 3.3 s, 317–496 after 8 s)."""


# ---- the rank side ----------------------------------------------------------------------------------------------
class _Trainer:
    """An MLP with Adam; the state it saves is every parameter and both Adam moments, under rank-own keys."""

    def __init__(self, rank: int, state_bytes: int, layers: int) -> None:
        import torch

        torch.manual_seed(rank)
        width = _width(state_bytes, layers)
        self.model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-5)
        self.x = torch.randn(8, width)
        self.rank = rank
        self.step(lambda: None)  # creates the Adam moments: the state has its full size

    def step(self, before_update: Callable[[], None]) -> None:
        import torch
        import torch.distributed as dist

        self.opt.zero_grad(set_to_none=True)
        loss = self.model(self.x).square().mean()
        loss.backward()
        dist.all_reduce(loss.detach().clone())  # lockstep with the other ranks
        before_update()
        with torch.no_grad():
            self.opt.step()

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, p in self.model.named_parameters():
            out[f"r{self.rank}.{name}"] = p
            for moment in ("exp_avg", "exp_avg_sq"):
                out[f"r{self.rank}.{name}.{moment}"] = self.opt.state[p][moment]
        return out


class _Saver:
    """One mode behind save / done / before_update / drain / close."""

    def __init__(self, mode: str, rank: int, store_dir: str, throttle_state: str, bandwidth: float,
                 *, root_name: str | None = None) -> None:
        import torch.distributed as dist

        from ckptio.demo.throttled_store import ThrottleSpec

        self.mode, self.rank = mode, rank
        self.throttle = ThrottleSpec(bytes_per_s=bandwidth, state_path=throttle_state)
        self.root = os.path.join(store_dir, root_name or mode)
        self.pending: Any = None
        self.group = dist.new_group(backend="gloo") if mode in ("dcp_async", "dcp_best") else None
        self.ck: Any = None
        self.best: DcpBest | None = None
        if mode == "ckptio":
            from ckptio import Checkpointer

            self.ck = Checkpointer(root=self.throttle.posix(self.root), max_pending=1, overflow="block", keep_last=2)
        elif mode == "dcp_best":
            self.best = DcpBest(process_group=self.group)

    def _writer(self, step: int) -> Any:
        from ckptio.demo.throttled_store import ThrottledFileSystemWriter

        return ThrottledFileSystemWriter(os.path.join(self.root, f"step-{step}"), throttle=self.throttle)

    def save(self, step: int, state: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        if self.mode == "ckptio":
            self.pending = self.ck.save(step, state)
            return
        if self.mode == "dcp_sync":
            dcp.save(state, storage_writer=self._writer(step))
            return
        self.drain()  # one save in flight
        if self.mode == "dcp_async":
            self.pending = dcp.async_save(state, storage_writer=self._writer(step), process_group=self.group)
            return
        assert self.best is not None
        self.pending = self.best.save(state, self._writer(step)).upload_completion

    def before_update(self) -> None:
        """The async savers' rule (ckptio's and DCP-best's): the staged copy is complete before the optimizer
        mutates the state."""
        if self.ck is not None:
            self.ck.wait_staged()
        if self.best is not None:
            self.best.wait_staged()

    def done(self) -> bool:
        return self.pending is None or self.pending.done()

    def drain(self) -> None:
        self.before_update()
        if self.mode == "ckptio":
            self.ck.wait()
        elif self.pending is not None:
            self.pending.result()
        self.pending = None

    def close(self) -> None:
        import torch.distributed as dist

        self.drain()
        if self.ck is not None:
            self.ck.close()
        if self.best is not None:
            self.best.close()
        if self.group is not None:
            dist.destroy_process_group(self.group)


def _trial_lost(mode: str, rank: int, cfg: dict[str, Any], trainer: _Trainer) -> float:
    """:func:`measure_save_loss` of ``mode``'s saver on a root of its own (kept until the end, as the runs' are)."""
    trial = _Saver(mode, rank, cfg["store_dir"], cfg["throttle_state"], cfg["bandwidth"], root_name=f"trial-{mode}")
    try:
        trial.save(0, trainer.state())  # warm-up, as a mode's run does
        trial.drain()

        def save(index: int) -> Callable[[], bool]:
            trial.save(index, trainer.state())
            return trial.done

        # At the job's own interval, as the runs save (measure_save_loss: the slow tail after a save).
        return measure_save_loss(lambda: trainer.step(trial.before_update), save, any_writing=any_rank,
                                 every=cfg["every"])
    finally:
        trial.close()


def _rank_main(rank: int, world: int, cfg: dict[str, Any]) -> None:
    import torch.distributed as dist

    quiet_dcp()
    trainer = _Trainer(rank, cfg["bytes_per_rank"], cfg["layers"])
    if cfg["mode"] == _CALIBRATE:
        for _ in range(3):
            trainer.step(lambda: None)
        drag = measure_fresh_copy_drag(lambda: trainer.step(lambda: None), trainer.state, steps=_DRAG_STEPS,
                                       steady_heap=not cfg["glibc_trim"])
        # ckptio's own writer, then DCP-best's (the buffered writer DCP's background modes share), each on a root
        # of its own on the same throttled store: what a trial save costs the steps.
        trials = {key: _trial_lost(mode, rank, cfg, trainer)
                  for key, mode in (("trial_lost_s", "ckptio"), ("buffered_trial_lost_s", "dcp_best"))}
        with open(os.path.join(cfg["out_dir"], f"{_CALIBRATE}.rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump({"drag": drag, **trials}, f)
        return
    saver = _Saver(cfg["mode"], rank, cfg["store_dir"], cfg["throttle_state"], cfg["bandwidth"])
    records: list[dict[str, Any]] = []
    try:
        saver.save(0, trainer.state())  # warm-up: writer booted, plans cached, staging memory allocated
        saver.drain()
        for _ in range(3):
            trainer.step(saver.before_update)
        dist.barrier()
        for index in range(1, cfg["saves"] + 1):
            began = time.perf_counter()
            saver.save(index, trainer.state())
            records.append({"save": index, "blocking_s": time.perf_counter() - began})
            for _ in range(cfg["every"]):
                in_flight = not saver.done()
                cpu_before = time.process_time(), children_cpu(), host_steal()
                began, sched = time.perf_counter(), thread_schedstat()
                trainer.step(saver.before_update)
                step_s = time.perf_counter() - began
                ran, waited = (b - a for a, b in zip(sched, thread_schedstat(), strict=True))
                process_s, children_s, steal_s = (
                    b - a for a, b in zip(cpu_before, (time.process_time(), children_cpu(), host_steal()), strict=True))
                records.append({"save": index, "step_s": step_s, "in_flight": in_flight, "cpu_s": ran,
                                "runqueue_s": waited, "process_cpu_s": process_s, "children_cpu_s": children_s,
                                "host_steal_s": steal_s})
        saver.drain()
    finally:
        saver.close()
    with open(os.path.join(cfg["out_dir"], f"{cfg['mode']}.rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(records, f)


# ---- the launcher side ------------------------------------------------------------------------------------------
def measured_lost(records: list[dict[str, Any]], saves: int) -> dict[str, float]:
    """One rank's figures: time lost per save (its standard error over the saves, and its blocking and contention
    parts), the mean clean step, the clean steps' shares of time on a CPU and waiting for one, steps in flight per
    save, and the save's CPU while its flush ran: its process's beyond a clean step's (default ``async_save``'s
    writer thread, DCP-best's staging thread) and its child processes' (DCP-best's checkpoint process, ckptio's
    writer), to hold against the model's ``background_cpu_s``."""
    clean = [r for r in records if "step_s" in r and not r["in_flight"]]
    mean_clean = statistics.fmean(r["step_s"] for r in clean)
    blocking = sum(r["blocking_s"] for r in records if "blocking_s" in r) / saves
    in_flight = [r for r in records if r.get("in_flight")]
    contention = sum(r["step_s"] - mean_clean for r in in_flight) / saves
    # Each save's own loss: their spread says how far the mean itself can be trusted.
    each = [sum(r.get("blocking_s", 0.0) + (r["step_s"] - mean_clean if r.get("in_flight") else 0.0)
                for r in records if r["save"] == index) for index in range(1, saves + 1)]
    stderr = standard_error(each)
    wall = sum(r["step_s"] for r in clean)
    clean_process = statistics.fmean(r["process_cpu_s"] for r in clean)
    save_cpu = sum(r["process_cpu_s"] - clean_process + r["children_cpu_s"] for r in in_flight) / saves
    # The host's steal during the in-flight steps beyond the clean steps' rate (every core; each rank sees the host).
    clean_steal = sum(r["host_steal_s"] for r in clean) / wall
    steal = sum(r["host_steal_s"] - clean_steal * r["step_s"] for r in in_flight) / saves
    return {"lost": blocking + contention, "lost_stderr": stderr, "blocking": blocking, "contention": contention,
            "step": mean_clean,
            "cpu_share": sum(r["cpu_s"] for r in clean) / wall, "rq_share": sum(r["runqueue_s"] for r in clean) / wall,
            "flight": len(in_flight) / saves, "save_cpu": save_cpu, "steal": steal}


def _run_ranks(mode: str, args: argparse.Namespace, workdir: str) -> None:
    from ckptio.testing.ranks import run_ranks

    store_dir = os.path.join(workdir, "store")
    os.makedirs(store_dir, exist_ok=True)
    throttle_state = os.path.join(workdir, f"throttle-{mode}.state")
    open(throttle_state, "wb").close()
    cfg = {"mode": mode, "bytes_per_rank": args.mib_per_rank * MIB, "store_dir": store_dir,
           "throttle_state": throttle_state, "bandwidth": args.store_bandwidth * MIB, "saves": args.saves,
           "every": args.every, "out_dir": workdir, "glibc_trim": args.glibc_trim, "layers": args.layers}
    run_ranks(args.ranks, _rank_main, cfg)


def _rank_records(mode: str, args: argparse.Namespace, workdir: str) -> list[Any]:
    """Run ``mode`` on fresh ranks and return what each rank wrote, in rank order."""
    _run_ranks(mode, args, workdir)
    records = []
    for rank in range(args.ranks):
        with open(os.path.join(workdir, f"{mode}.rank{rank}.json"), encoding="utf-8") as f:
            records.append(json.load(f))
    return records


def _means(figures: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.fmean(f[key] for f in figures) for key in figures[0]}


def calibrate(args: argparse.Namespace, workdir: str) -> dict[str, float]:
    """The job's :attr:`Host.fresh_copy_drag` and a trial ckptio save's time lost (``trial_lost_s``), measured
    on fresh ranks before any mode runs (means of the ranks)."""
    return _means(_rank_records(_CALIBRATE, args, workdir))


def run_order(modes: list[str]) -> list[str]:
    """The order the modes run in: ckptio first, right after the trial save that calibrates it, on a host that has
    seen only that trial, as a job starts right after its plan; the others as given. Run after the three DCP modes,
    whose files stay in the page cache (see :func:`run_mode`), ckptio lost more than its trial (predicted ÷
    measured 0.76–0.88 in four runs; first, 0.69–1.45 in five, each within the bar; docs/planning.md): a ckptio
    job's host does not hold another writer's gigabytes."""
    return sorted(modes, key=lambda mode: mode != "ckptio")


def run_mode(mode: str, args: argparse.Namespace, workdir: str) -> dict[str, float]:
    """Run one mode on fresh ranks; :func:`measured_lost`'s figures averaged over ranks."""
    # The checkpoints stay until the end: deleting them here would free their page cache just before the next
    # mode runs, and pages freed a moment ago make its writer's page-cache writes several times cheaper than a
    # steady job's (docs/planning-measurements.md). ckptio's own retention still deletes within its run.
    return _means([measured_lost(records, args.saves) for records in _rank_records(mode, args, workdir)])


def predict(args: argparse.Namespace, state_bytes: int, costs: WriterCosts, calibration: dict[str, float],
            disk: DiskRates, *, cpu_share: float = 1.0) -> dict[str, ModeCost]:
    """The planner's figures for this job; ``calibration`` is :func:`calibrate`'s, ``disk``
    :func:`ckptio.plan.measure.disk.measure_disk`'s, ``cpu_share`` the host's load as the training thread felt it."""
    shape = uniform_shape(ranks=args.ranks, bytes_per_rank=state_bytes)
    booked_s = flush_times(shape, StoreLimits(write_bytes_per_s=args.store_bandwidth * MIB)).total_s
    job_bytes = args.ranks * state_bytes
    host = Host(cores_per_rank=(os.cpu_count() or 1) / args.ranks, train_cores=1.0,
                cpu_share=min(1.0, max(cpu_share, 1e-3)), fresh_copy_drag=calibration["drag"],
                direct_io_s_per_gib=calibration["direct_io_s_per_gib"],
                buffered_io_s_per_gib=calibration["buffered_io_s_per_gib"])
    # ckptio's writer goes around the page cache on a disk (O_DIRECT); on tmpfs the bytes land in memory pages.
    direct_io = not os.path.realpath(args.dir or tempfile.gettempdir()).startswith("/dev/shm")
    if not args.glibc_trim:
        # Default async_save allocates its staging copy at every save. Here each tensor (~11 MiB) is below the
        # ranks' mmap threshold and their heap is never trimmed (_STEADY_HEAP), so from the second save on the copy
        # lands in pages the last one touched: the touched-memory rate, not the fresh one (measured blocking 35–58
        # ms for 128 MiB; the fresh rate predicted 100–157, the touched one 19–27).
        costs = dataclasses.replace(costs, fresh_copy_bytes_per_s=costs.copy_bytes_per_s)
    # The store is a budget on this host's disk (ThrottleSpec): each writer takes the longer of its booking and its
    # real write, DCP's files through the page cache and its fsync, ckptio's around it. On a disk slower than the
    # budget the disk binds: dcp.save lost 0.77-0.84 s per save with the budget at 400 MiB/s and 0.81 s with no
    # budget at all, against the booking's 0.64 s (one VM, one hour).
    workload = Workload(bytes_per_rank=state_bytes, lockstep_ranks=args.ranks, items_per_rank=3 * args.layers)
    store = on_local_disk(disk, job_bytes=job_bytes, ranks=args.ranks, booked_s=booked_s, direct_io=direct_io)
    return predict_modes(workload, store, host=host, costs=costs)


def _width(state_bytes: int, layers: int) -> int:
    """Width of the square layers whose weights and two Adam moments (3 fp32 copies) make ``state_bytes``."""
    return max(64, int((state_bytes / 3 / 4 / layers) ** 0.5))


def _state_bytes(mib_per_rank: int, layers: int) -> int:
    return 3 * 4 * layers * _width(mib_per_rank * MIB, layers) ** 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mib-per-rank", type=int, default=192, help="state per rank (weights + Adam moments)")
    parser.add_argument("--every", type=int, default=40, help="steps between saves")
    parser.add_argument("--layers", type=int, default=_LAYERS,
                        help="square layers the state is split over (3 state items each), same bytes")
    parser.add_argument("--saves", type=int, default=8, help="timed saves per mode (after a warm-up save)")
    parser.add_argument("--store-bandwidth", type=float, default=400.0, help="MiB/s shared by all ranks")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of the modes")
    parser.add_argument("--dir", default=None,
                        help="parent of the store directory (default: the temp dir, on disk as a job's store is)")
    parser.add_argument("--glibc-trim", action="store_true",
                        help="run the ranks with glibc's default heap trimming (see _STEADY_HEAP)")
    args = parser.parse_args()
    if args.layers < 1:
        parser.error(f"--layers must be >= 1, got {args.layers}")
    quiet_dcp()
    if not args.glibc_trim:
        os.environ.update(_STEADY_HEAP)  # read by glibc at the start of each spawned rank (not this process)
    modes = [m for m in args.modes.split(",") if m]
    workdir = tempfile.mkdtemp(prefix="ckptio-bench-planner-", dir=args.dir)
    try:
        load_before = os.getloadavg()
        costs = measure_writer_costs(directory=workdir)
        disk = measure_disk(workdir)
        # The probe has just deleted its files: let the freed pages go cold before any mode runs (see above).
        time.sleep(_SETTLE_S)
        state_bytes = _state_bytes(args.mib_per_rank, args.layers)
        calibration = calibrate(args, workdir)
        # Each trial's excess: what it lost beyond the model's charge for that save without the term.
        bare = predict(args, state_bytes, costs,
                       {**calibration, "direct_io_s_per_gib": 0.0, "buffered_io_s_per_gib": 0.0}, disk)
        modelled = bare["ckptio"]
        calibration["direct_io_s_per_gib"] = excess_from_trial(calibration["trial_lost_s"], modelled, state_bytes)
        calibration["buffered_io_s_per_gib"] = excess_from_trial(calibration["buffered_trial_lost_s"],
                                                                 bare["dcp_best"], state_bytes)
        quiet = predict(args, state_bytes, costs, calibration, disk)
        predicted: dict[str, ModeCost] = {}
        print(f"host: {os.cpu_count()} cores, {args.ranks} ranks; load average {load_before[0]:.2f} "
              f"{load_before[1]:.2f} {load_before[2]:.2f} before the runs")
        costs_line(costs)
        print(f"the disk under the store: {disk.direct_bytes_per_s / MIB:,.0f} MiB/s O_DIRECT, "
              f"{disk.writeback_bytes_per_s / MIB:,.0f} MiB/s write-back at fsync (one writer; the store's "
              f"budget: {args.store_bandwidth:g} MiB/s)")
        print(f"training's step with a fresh copy of its state alive: {1 + calibration['drag']:.3f}x "
              f"(fresh_copy_drag); a trial ckptio save of every rank at once cost it "
              f"{calibration['trial_lost_s'] * 1e3:.1f} ms, {modelled.lost_per_save_s * 1e3:.1f} from the model's "
              f"CPU costs: {calibration['direct_io_s_per_gib']:.2f} s/GiB more (direct_io_s_per_gib); a trial "
              f"DCP-best save {calibration['buffered_trial_lost_s'] * 1e3:.1f} ms, "
              f"{bare['dcp_best'].lost_per_save_s * 1e3:.1f} from the model's: "
              f"{calibration['buffered_io_s_per_gib']:.2f} s/GiB more (buffered_io_s_per_gib); ranks' heap: "
              f"{'glibc defaults' if args.glibc_trim else 'large buffers kept, never trimmed'}")
        print(f"job: {args.ranks} ranks x {state_bytes / MIB:.0f} MiB, a save every {args.every} steps, "
              f"{args.saves} saves per mode, store {args.store_bandwidth:g} MiB/s shared, in {workdir}")
        measured = {}
        for mode in run_order(modes):
            measured[mode] = run_mode(mode, args, workdir)
            m = measured[mode]
            # The host's other load, as the training thread felt it in the clean steps (no save in them).
            share = m["cpu_share"] / (m["cpu_share"] + m["rq_share"]) if m["cpu_share"] > 0 else 1.0
            p = predicted[mode] = predict(args, state_bytes, costs, calibration, disk, cpu_share=share)[mode]
            print(f"  {mode:<10} lost {m['lost'] * 1e3:7.1f} ± {m['lost_stderr'] * 1e3:.1f} ms/save (standard error "
                  f"over saves) = blocking {m['blocking'] * 1e3:.1f} + "
                  f"contention {m['contention'] * 1e3:.1f}; predicted {p.blocking_s * 1e3:.1f} + "
                  f"{p.stolen_s * 1e3:.1f} (quiet host: {quiet[mode].lost_per_save_s * 1e3:.1f}); clean step "
                  f"{m['step'] * 1e3:.1f} ms, on CPU {m['cpu_share']:.0%}, waiting for one {m['rq_share']:.0%} "
                  f"(share {share:.2f}); {m['flight']:.1f} steps in flight/save; the save's CPU while in flight "
                  f"{m['save_cpu']:.2f} s (model: {p.background_cpu_s:.2f}), the host's steal "
                  f"{m['steal']:.2f} s; load {os.getloadavg()[0]:.2f}",
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report(args, modes, predicted, measured)


def report(args: argparse.Namespace, modes: list[str], predicted: dict[str, ModeCost],
           measured: dict[str, dict[str, float]]) -> int:
    prediction_check({m: (predicted[m].lost_per_save_s, measured[m]["lost"], args.every * measured[m]["step"])
                      for m in modes})
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
