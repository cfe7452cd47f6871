"""One rank of the demo job: ``python -m ckptio.demo.rank JOB.json RANK``.

Joins the launcher's rendezvous (a TCPStore on 127.0.0.1), trains the demo model with the run's saver, times
every step, and writes its :class:`~ckptio.demo.job.RankResult`. A ``resume`` run restores the newest ckptio
step in this fresh process group and trains on from there, recording the losses to compare with the
uninterrupted run. This module must never decide what the demo prints: it only measures."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sys
import time
from collections.abc import Callable
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ckptio import Checkpointer
from ckptio.demo.job import Mode, RankJob, RankResult, SaveRecord
from ckptio.demo.model import Trainer, TrainState
from ckptio.demo.savers import (
    CkptioSaver,
    DcpAsyncSaver,
    DcpBestSaver,
    DcpSyncSaver,
    Saver,
    open_demo_storage,
    step_dir,
)
from ckptio.obs.events import EventLog
from ckptio.obs.steps import StepTimer
from ckptio.plan.measure.disk import drop_page_cache
from ckptio.plan.measure.training import any_rank, measure_save_loss

_RENDEZVOUS_TIMEOUT = timedelta(seconds=120)


def _join(job: RankJob, rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", job.store_port, is_master=False, timeout=_RENDEZVOUS_TIMEOUT)
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("-".join(job.runs), store),
        rank=rank,
        world_size=job.world,
        timeout=_RENDEZVOUS_TIMEOUT,
    )


def _make_saver(job: RankJob, run: Mode, rank: int, events: EventLog) -> Saver:
    if run == "dcp-sync":
        return DcpSyncSaver(job.stores[run], events, job.bytes_per_rank)
    if run == "dcp-async":
        return DcpAsyncSaver(job.stores[run], events, job.bytes_per_rank)
    if run == "dcp-best":
        return DcpBestSaver(job.stores[run], events, job.bytes_per_rank)
    return CkptioSaver(job.stores[run], job.events_pattern(run), rank)


class _Progress:
    """Rank 0 tells the launcher which run and step it is on (one tiny overwrite per step)."""

    def __init__(self, path: str, run: Mode, rank: int) -> None:
        self.path = path if rank == 0 else None
        self.run = run

    def report(self, step: int) -> None:
        if self.path is not None:
            with open(self.path + ".tmp", "w") as f:
                f.write(f"{self.run} {step}")
            os.replace(self.path + ".tmp", self.path)


_STARTED = time.monotonic()


def log(message: str) -> None:
    """One timestamped line in this rank's log (the launcher keeps it under ``run/logs``)."""
    print(f"[{time.monotonic() - _STARTED:7.2f} s] {message}", flush=True)


def train(job: RankJob, rank: int, *, saver: Saver, events: EventLog, trainer: Trainer, result: RankResult) -> None:
    """The measured run: train ``job.steps`` steps, saving at ``job.save_steps()``."""
    timer = StepTimer(events)
    state = {"app": TrainState(trainer, _mesh(job))}
    progress = _Progress(job.progress_path, result.mode, rank)
    saves = set(job.save_steps())

    def before_update() -> None:
        # The wait for the last save's staging copy belongs to that save (it is part of its stall).
        waited = saver.before_update()
        if result.saves:
            result.saves[-1].staging_wait_s += waited

    for step in range(1, job.steps + 1):
        with timer.step(step):
            result.losses[step] = trainer.train_step(before_update)
            if step in saves:
                began = time.monotonic()
                saver.save(step, state)
                result.saves.append(SaveRecord(step=step, blocking_s=time.monotonic() - began))
        result.step_seconds[step] = timer.last_seconds or 0.0
        progress.report(step)
        if step in saves and result.first_durable_s is None:
            # The first save apart: wait (untimed by the steps) until it is durable, so its one-time costs
            # never spill into the steady saves after it.
            before_update()
            saver.drain()
            result.first_durable_s = time.monotonic() - began
    log(f"trained {job.steps} steps")
    began = time.monotonic()
    saver.drain()
    result.drain_s = time.monotonic() - began
    log(f"last saves durable after {result.drain_s:.2f} s")
    lags = saver.lags()
    for record in result.saves:
        record.lag_s = lags.get(record.step)
    # Every rank's saves are done before rank 0 reads what is committed: another may still be waiting on a manifest.
    dist.barrier()
    if rank == 0:
        result.committed = saver.committed()


def resume(job: RankJob, rank: int, checkpointer: Checkpointer, trainer: Trainer, result: RankResult) -> None:
    """Restore the newest ckptio step in this fresh process group, time it against plain ``dcp.load`` of DCP's copy
    of the same step (each from a cold page cache), then train on to ``job.steps`` from ckptio's restore."""
    mesh = _mesh(job)
    state = {"app": TrainState(trainer, mesh)}
    progress = _Progress(job.progress_path, "resume", rank)
    # DCP loads into a model of its own: what training goes on from, and the losses compared, are ckptio's.
    copy = {"app": TrainState(Trainer(job.shape, rank=rank, world=job.world, seed=job.seed), mesh)} \
        if job.dcp_copy_root else None
    result.page_cache = _cold_start(job, rank)
    began = time.monotonic()
    result.restored_step = checkpointer.restore(state)
    result.restore_s = time.monotonic() - began
    log(f"restored step {result.restored_step} in {result.restore_s:.2f} s")
    dcp_dir = os.path.join(job.dcp_copy_root or "", step_dir(result.restored_step or 0))
    if copy is not None and result.restored_step is not None and os.path.isfile(os.path.join(dcp_dir, ".metadata")):
        _cold_start(job, rank)
        began = time.monotonic()
        dcp.load(copy, checkpoint_id=dcp_dir)
        result.dcp_load_s = time.monotonic() - began
        log(f"dcp.load of the same step from {dcp_dir} in {result.dcp_load_s:.2f} s")
    del copy
    for step in range(trainer.step + 1, job.steps + 1):
        began = time.monotonic()
        result.losses[step] = trainer.train_step()
        result.step_seconds[step] = time.monotonic() - began
        progress.report(step)


def _cold_start(job: RankJob, rank: int) -> str | None:
    """Every rank starts the next timed read together, from a cold page cache. The cache is the host's, so rank 0
    empties it for all (its result says how; the others' None); the store's and DCP's copy's files where it can only
    drop them one by one."""
    dist.barrier()
    how = None
    if rank == 0:
        roots = [spec.root for spec in job.stores.values() if spec.kind == "posix"]
        how = drop_page_cache([*roots, *([job.dcp_copy_root] if job.dcp_copy_root else [])])
    dist.barrier()
    return how


class _CpuMeter:
    """CPU seconds (user + system) of this rank's process and of its child processes (ckptio's writer,
    DCP-best's checkpoint process) since construction: where the cores went while the run trained."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.rank_start = self._cpu(self.me)
        self.children_start = {child.pid: self._cpu(child) for child in self._children()}

    @staticmethod
    def _cpu(process: psutil.Process) -> float:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            return float(times.user + times.system)
        return 0.0

    def _children(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return self.me.children(recursive=True)
        return []

    def read(self) -> tuple[float, float]:
        children = sum(self._cpu(c) - self.children_start.get(c.pid, 0.0) for c in self._children())
        return self._cpu(self.me) - self.rank_start, children


def _mesh(job: RankJob) -> DeviceMesh:
    return init_device_mesh("cpu", (job.world,))


def run_training(job: RankJob, run: Mode, rank: int) -> RankResult:
    """One measured training run in this process group; its saver and model are built and released here."""
    began = time.monotonic()
    result = RankResult(mode=run, rank=rank)
    with contextlib.ExitStack() as stack:
        events = stack.enter_context(
            contextlib.closing(EventLog(job.events_path(run, rank), rank=rank, role="trainer"))
        )
        # The saver comes first, as in a real job: ckptio's writer process boots while the model is built.
        saver = _make_saver(job, run, rank, events)
        stack.callback(saver.close)
        trainer = Trainer(job.shape, rank=rank, world=job.world, seed=job.seed)
        log(f"{run}: model built")
        result.ready_s = saver.ready()
        if result.ready_s:
            log(f"{run}: waited {result.ready_s:.2f} s more for the saver to be ready")
        dist.barrier()  # every rank starts step 1 together
        cpu = _CpuMeter()
        train(job, rank, saver=saver, events=events, trainer=trainer, result=result)
        result.rank_cpu_s, result.saver_cpu_s = cpu.read()
        result.wall_s = time.monotonic() - began
    return result


def run_resume(job: RankJob, rank: int) -> RankResult:
    """Restore the newest ckptio step into a freshly built model, then train on."""
    began = time.monotonic()
    result = RankResult(mode="resume", rank=rank)
    # Restore only: no writer process to boot.
    with Checkpointer(root=open_demo_storage(job.stores["resume"]), start_writer="on_first_save") as checkpointer:
        trainer = Trainer(job.shape, rank=rank, world=job.world, seed=job.seed)
        log("resume: model built")
        resume(job, rank, checkpointer, trainer, result)
    result.wall_s = time.monotonic() - began
    return result


def run_calibration(job: RankJob, rank: int) -> RankResult:
    """What a save of ckptio's own writer costs this job's steps, every rank saving its share into a store of its own at
    once (:func:`ckptio.plan.measure.training.measure_save_loss`): the planner's measure of what its model cannot derive
    from per-byte CPU costs, taken before any run. Its checkpoints are removed at the end."""
    began = time.monotonic()
    result = RankResult(mode="calibrate", rank=rank)
    spec = job.stores["calibrate"]
    with contextlib.ExitStack() as stack:
        saver = CkptioSaver(spec, job.events_pattern("calibrate"), rank)
        stack.callback(saver.close)
        trainer = Trainer(job.shape, rank=rank, world=job.world, seed=job.seed)
        state = {"app": TrainState(trainer, _mesh(job))}
        saver.ready()

        def step() -> None:
            trainer.train_step(saver.before_update)

        def save(index: int) -> Callable[[], bool]:
            saver.save(index, state)
            return saver.done

        for _ in range(2):
            step()  # warm-up: first-touch allocation of the Adam moments
        save(0)  # warm-up: the writer's first save (plans, staging memory)
        saver.drain()
        result.trial_lost_s = measure_save_loss(step, save, any_writing=any_rank, every=job.every)
        result.trial_bytes = saver.staged_bytes()
    log(f"calibrate: a trial ckptio save cost the step {result.trial_lost_s * 1e3:.0f} ms")
    dist.barrier()  # every rank's saves are done before rank 0 removes them
    if rank == 0:
        shutil.rmtree(spec.root, ignore_errors=True)
    result.wall_s = time.monotonic() - began
    return result


def main(argv: list[str]) -> int:
    job = RankJob.load(argv[0])
    rank = int(argv[1])
    # One compute thread per rank: the ranks (and ckptio's writers) share the machine's cores.
    torch.set_num_threads(1)
    log(f"rank {rank}/{job.world} started for {', '.join(job.runs)}")
    _join(job, rank)
    log("joined the process group")
    try:
        for run in job.runs:
            if run == "resume":
                result = run_resume(job, rank)
            elif run == "calibrate":
                result = run_calibration(job, rank)
            else:
                result = run_training(job, run, rank)
            dist.barrier()
            result.dump(job.result_path(run, rank))
            log(f"{run}: done")
            gc.collect()  # the previous run's model and staging go before the next run allocates its own
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
