"""Step-time inflation of a CPU training loop while a flush runs: ckptio vs default ``dcp.async_save`` (thread)
and DCP-best (checkpoint process, async staging into shared memory; ``ckptio.demo.dcp_best.DcpBest``).

A small MLP trained with Adam (state = weights + both Adam moments). Each method runs the same loop: warm-up steps,
then ``--saves`` rounds of: save; train until that save's flush has committed (steps *in flight*); train ``--clean``
more steps with nothing in flight (steps *clean*). Only the training step is timed (forward, backward, optimizer),
never the ``save`` call itself (that is bench_save_blocking's job). A step counts as in flight when the flush was
still running when the step ended, as clean when no flush was running when it began; steps the flush ended
inside are dropped. The figure is median(in flight) ÷ median(clean), for each method, measured in this run.

On a 2-core machine the flush competes with training for CPU however it runs: ckptio's writer is a separate
process (no GIL), default DCP's is a thread in the training process, DCP-best's a process of its own fed by a
staging thread. DCP-best's step waits for ``staging_completion`` before ``optimizer.step``; that wait is the
save's blocking, not inflation, so it is taken out of the step time (and printed). ``dcp.save`` runs no step
while it writes: its inflation is 1 by construction (its cost is all blocking, see bench_save_blocking).
``--threads`` sets torch's intra-op threads for every method.

    .venv/bin/python bench/bench_step_inflation.py [--threads 1] [--saves 3] [--dir /tmp]

Goals (bench/README.md): ckptio ≤ 1.05; ``vs_dcp_best`` (ckptio's inflation ÷ DCP-best's) ≤ 1.0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import (
    MiB,
    ensure_process_group,
    phase_summary,
    quiet_dcp,
    ratio_line,
    read_events,
    renice_writers,
    scratch_dir,
    state_bytes,
    verdict,
)
from ckptio.demo.dcp_best import DcpBest


class Trainer:
    """An MLP + Adam on random data; ``step()`` is one optimizer step."""

    def __init__(self, width: int, depth: int, batch: int) -> None:
        import torch

        torch.manual_seed(0)
        layers: list[Any] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.model = torch.nn.Sequential(*layers[:-1])
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, width)
        self.y = torch.randn(batch, width)

    def step(self, before_update: Callable[[], float] | None = None) -> float:
        """One step; returns the seconds ``before_update`` waited (a staging wait, not training)."""
        import torch

        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        waited = before_update() if before_update is not None else 0.0
        self.opt.step()
        return waited

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}


def run_loop(trainer: Trainer, save: Callable[[int], Callable[[], bool]], *, warmup: int, saves: int,
             clean: int, max_inflight: int, before_update: Callable[[], float] | None = None,
             ) -> tuple[list[float], list[float], list[int]]:
    """Returns (in-flight step times, clean step times, in-flight step counts per save)."""

    def timed_step() -> float:
        t0 = time.perf_counter()
        waited = trainer.step(before_update)
        return time.perf_counter() - t0 - waited

    for _ in range(warmup):
        trainer.step()
    inflight, quiet, counts = [], [], []
    for n in range(saves):
        done = save(n + 1)
        count = 0
        while not done():
            dt = timed_step()
            if not done():
                inflight.append(dt)
                count += 1
            if count >= max_inflight:
                break
        counts.append(count)
        while not done():  # a flush longer than max_inflight steps: wait for it, untimed
            time.sleep(0.01)
        for _ in range(clean):
            quiet.append(timed_step())
    return inflight, quiet, counts


def bench_ckptio(trainer: Trainer, root: str, events: str, args: argparse.Namespace) -> tuple[float, list[int]]:
    import ckptio

    ck = ckptio.Checkpointer(os.path.join(root, "ckptio"), max_pending=1, keep_last=2, events_path=events)
    try:
        ck.save(0, trainer.state()).wait()  # boot the writer and plan before the timed loop
        if args.writer_nice:
            print(f"(diagnosis) writer processes {renice_writers(args.writer_nice)} set to nice {args.writer_nice}")

        def save(step: int) -> Callable[[], bool]:
            return ck.save(step, trainer.state()).done

        inflight, quiet, counts = run_loop(trainer, save, warmup=args.warmup, saves=args.saves, clean=args.clean,
                                           max_inflight=args.max_inflight)
    finally:
        ck.close()
    return report("ckptio", inflight, quiet, counts)


def bench_dcp(trainer: Trainer, root: str, args: argparse.Namespace) -> tuple[float, list[int]]:
    import torch.distributed.checkpoint as dcp

    dcp.async_save(trainer.state(), checkpoint_id=os.path.join(root, "dcp-0")).result()  # warm-up

    def save(step: int) -> Callable[[], bool]:
        return dcp.async_save(trainer.state(), checkpoint_id=os.path.join(root, f"dcp-{step}")).done

    inflight, quiet, counts = run_loop(trainer, save, warmup=args.warmup, saves=args.saves, clean=args.clean,
                                       max_inflight=args.max_inflight)
    return report("dcp.async_save", inflight, quiet, counts)


def bench_dcp_best(trainer: Trainer, root: str, args: argparse.Namespace) -> tuple[float, list[int]]:
    import torch.distributed.checkpoint as dcp

    best = DcpBest()
    waits: list[float] = []

    def before_update() -> float:
        waited = best.wait_staged()
        waits.append(waited)
        return waited

    try:
        best.save(trainer.state(), dcp.FileSystemWriter(os.path.join(root, "dcp-best-0")))
        best.wait()  # warm-up: spawns DCP's checkpoint process

        def save(step: int) -> Callable[[], bool]:
            best.save(trainer.state(), dcp.FileSystemWriter(os.path.join(root, f"dcp-best-{step}")))
            return best.done

        inflight, quiet, counts = run_loop(trainer, save, warmup=args.warmup, saves=args.saves, clean=args.clean,
                                           max_inflight=args.max_inflight, before_update=before_update)
    finally:
        best.close()
    staged = [w for w in waits if w > 0]
    print(f"DCP-best staging waits before optimizer.step (taken out of the steps): "
          f"{len(staged)} x, median {statistics.median(staged) * 1e3 if staged else 0.0:.1f} ms")
    return report("DCP-best", inflight, quiet, counts)


def bench_fio(trainer: Trainer, root: str, nbytes: int, args: argparse.Namespace) -> tuple[float, list[int]]:
    """Diagnosis floor: the same bytes written by fio (write + end fsync, its own process) while the loop runs.
    What this inflates is the cost of the write itself on this host (page cache, writeback, the VM's disk path)."""
    import subprocess

    fio_dir = os.path.join(root, "fio")
    os.makedirs(fio_dir, exist_ok=True)
    cmd = ["fio", "--name=w", "--rw=write", "--bs=16M", "--end_fsync=1", f"--size={nbytes}", "--numjobs=1",
           f"--directory={fio_dir}", "--output=/dev/null"]

    def save(_step: int) -> Callable[[], bool]:
        proc = subprocess.Popen(cmd)
        return lambda: proc.poll() is not None

    inflight, quiet, counts = run_loop(trainer, save, warmup=args.warmup, saves=args.saves, clean=args.clean,
                                       max_inflight=args.max_inflight)
    return report("fio (floor)", inflight, quiet, counts)


def report(label: str, inflight: list[float], quiet: list[float], counts: list[int]) -> tuple[float, list[int]]:
    if not inflight:
        print(f"{label:<15} no step overlapped a flush entirely (flush shorter than a step): inflation 1.0")
        return 1.0, counts
    ratio = statistics.median(inflight) / statistics.median(quiet)
    print(f"{label:<15} clean {statistics.median(quiet) * 1e3:6.1f} ms (n={len(quiet)})   in flight "
          f"{statistics.median(inflight) * 1e3:6.1f} ms (n={len(inflight)}, per save {counts})   -> {ratio:.3f}",
          flush=True)
    return ratio, counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=5, help="Linear layers")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for the training loop")
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--clean", type=int, default=15, help="clean steps after each flush commits")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-inflight", type=int, default=60, help="stop timing a flush after this many steps")
    parser.add_argument("--dir", default=None, help="parent of the scratch directory (default: /tmp)")
    parser.add_argument("--writer-nice", type=int, default=0,
                        help="diagnosis: renice ckptio's writer process to this niceness (0 = as the engine runs it)")
    parser.add_argument("--only", choices=("all", "ckptio", "dcp", "dcp-best"), default="all",
                        help="which methods to run")
    parser.add_argument("--fio-floor", action="store_true",
                        help="diagnosis: also run fio writing the same bytes alongside the loop (inflation floor)")
    args = parser.parse_args()

    quiet_dcp()
    import torch

    torch.set_num_threads(args.threads)
    ensure_process_group()
    trainer = Trainer(args.width, args.depth, args.batch)
    for _ in range(3):
        trainer.step()  # creates the Adam state so the checkpoint has its full size
    nbytes = state_bytes(trainer.state())
    t0 = time.perf_counter()
    for _ in range(5):
        trainer.step()
    print(f"MLP {args.depth} x {args.width}, batch {args.batch}, torch threads {args.threads}: state "
          f"{nbytes / MiB:.0f} MiB, ~{(time.perf_counter() - t0) / 5 * 1e3:.0f} ms/step; {args.saves} saves, "
          f"{args.clean} clean steps after each commit", flush=True)

    with scratch_dir(args.dir, "ckptio-bench-steps-") as root:
        events = str(root / "events.jsonl")
        nan = float("nan")
        dcp_ratio = bench_dcp(trainer, str(root), args)[0] if args.only in ("all", "dcp") else nan
        best_ratio = bench_dcp_best(trainer, str(root), args)[0] if args.only in ("all", "dcp-best") else nan
        ck_ratio = bench_ckptio(trainer, str(root), events, args)[0] if args.only in ("all", "ckptio") else nan
        if args.fio_floor:
            fio_ratio = bench_fio(trainer, str(root), nbytes, args)[0]
            print(f"(diagnosis) fio writing {nbytes / MiB:.0f} MiB alongside the loop inflates steps {fio_ratio:.3f}")
        if args.only in ("all", "ckptio"):
            print(f"ckptio phases of the last save: {phase_summary(read_events(events), args.saves)}")

    print(f"ckptio inflation {ck_ratio:.3f} ({verdict(ck_ratio, 1.05, at_most=True)}); "
          f"dcp.async_save inflation {dcp_ratio:.3f}; DCP-best inflation {best_ratio:.3f}; "
          f"dcp.save 1 by construction")
    ratio_line(ckptio_inflation=ck_ratio, dcp_async_inflation=dcp_ratio, dcp_best_inflation=best_ratio,
               ckptio_vs_dcp=ck_ratio / dcp_ratio, vs_dcp_best=ck_ratio / best_ratio, threads=args.threads,
               state_mib=f"{nbytes / MiB:.0f}", writer_nice=args.writer_nice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
