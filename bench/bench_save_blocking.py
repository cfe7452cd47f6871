"""Blocking time of ``Checkpointer.save`` vs (a) ``copy_`` into preallocated buffers, (b) default DCP
``async_save``, (c) DCP-best and (d) ``dcp.save``.

One process (a one-rank gloo group, which DCP-best's checkpoint process needs). The state is ``--big`` fp32 tensors of
``--big-mib`` MiB plus ``--tiny`` tiny tensors (default 16 x 32 MiB + 2,000 = 512 MiB). Anchor (a) is bytes ÷ the
bandwidth of ``copy_`` from the same big tensors into preallocated, already-touched buffers, measured in this run; (b)
is the time until default ``torch.distributed.checkpoint.async_save`` returns; (c) is DCP's strongest async path
(checkpoint process, async staging into shared memory; ``ckptio.demo.dcp_best.DcpBest``): the time its ``async_save``
returns and the time until ``staging_completion`` (time-to-mutable: the state may change only then); (d) is the time
``dcp.save`` takes (the training thread waits for the write). Between reps every background flush is waited for
(untimed), so each rep measures staging, not queueing behind the previous save. Median of ``--reps`` after one warm-up
(for DCP-best the warm-up spawns its checkpoint process).

    .venv/bin/python bench/bench_save_blocking.py [--reps 3] [--dir /tmp]

Goals (bench/README.md): ckptio ≤ 1.5 × (a) and ≤ 0.3 × (b); ``vs_dcp_best`` (ckptio's return ÷ DCP-best's
time-to-mutable) ≤ 1.0.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

from _common import (
    MiB,
    ensure_process_group,
    fmt_times,
    make_state,
    median_time,
    phase_summary,
    quiet_dcp,
    ratio_line,
    read_events,
    scratch_dir,
    state_bytes,
    verdict,
)
from ckptio.demo.dcp_best import DcpBest


def copy_anchor(state: dict, reps: int) -> tuple[float, float, float]:
    """(bandwidth B/s of copy_ over the big tensors, median s to copy_ every tensor, median s of the big ones)."""
    import torch

    big = [t for k, t in state.items() if k.startswith("big.")]
    every = list(state.values())
    dst_big = [torch.empty_like(t).fill_(0) for t in big]  # touched: no page faults inside the timing
    dst_every = dst_big + [torch.zeros_like(t) for k, t in state.items() if not k.startswith("big.")]

    def copy(dsts: list, srcs: list) -> None:
        with torch.no_grad():
            for d, s in zip(dsts, srcs, strict=True):
                d.copy_(s)

    big_s, _ = median_time(lambda _r: copy(dst_big, big), reps)
    every_s, _ = median_time(lambda _r: copy(dst_every, every), reps)
    return sum(t.nbytes for t in big) / big_s, every_s, big_s


def bench_dcp(state: dict, root: str, reps: int) -> tuple[float, list[float]]:
    import torch.distributed.checkpoint as dcp

    futures: list = []

    def run(rep: int) -> None:
        futures.append(dcp.async_save(state, checkpoint_id=os.path.join(root, f"dcp-{rep + 1}")))

    return median_time(run, reps, after=lambda _r: futures.pop().result())


def bench_dcp_best(state: dict, root: str, reps: int) -> tuple[float, list[float], float, list[float]]:
    """(median s until its async_save returns, returns, median time-to-mutable s, times-to-mutable) of DCP-best:
    time-to-mutable is the call plus the wait on ``staging_completion``, when the state may change again."""
    import statistics
    import time

    import torch.distributed.checkpoint as dcp

    best = DcpBest()
    returns: list[float] = []

    def run(rep: int) -> None:
        t0 = time.perf_counter()
        best.save(state, dcp.FileSystemWriter(os.path.join(root, f"dcp-best-{rep + 1}")))
        if rep >= 0:
            returns.append(time.perf_counter() - t0)
        best.wait_staged()

    try:
        mutable_s, mutable = median_time(run, reps, after=lambda _r: best.wait())
    finally:
        best.close()
    return statistics.median(returns), returns, mutable_s, mutable


def bench_dcp_sync(state: dict, root: str, reps: int) -> tuple[float, list[float]]:
    import torch.distributed.checkpoint as dcp

    return median_time(lambda rep: dcp.save(state, checkpoint_id=os.path.join(root, f"dcp-sync-{rep + 1}")), reps)


def bench_ckptio(state: dict, root: str, reps: int, events: str, profile: bool) -> tuple[float, list[float]]:
    import ckptio

    ck = ckptio.Checkpointer(os.path.join(root, "ckptio"), max_pending=1, keep_last=2, events_path=events)
    handles: list = []
    prof = cProfile.Profile() if profile else None
    try:
        def run(rep: int) -> None:
            if prof is not None and rep >= 0:
                prof.enable()
            handles.append(ck.save(rep + 1, state))  # warm-up is step 0: boots the writer, plans, allocates
            if prof is not None and rep >= 0:
                prof.disable()

        result = median_time(run, reps, after=lambda _r: handles.pop().wait())
    finally:
        ck.close()
    if prof is not None:
        print("\n-- cProfile of ckptio save() over the timed reps (cumulative, top 25) --")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(25)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=16, help="number of large tensors")
    parser.add_argument("--big-mib", type=int, default=32, help="MiB per large tensor")
    parser.add_argument("--tiny", type=int, default=2000, help="number of 16-element tensors")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--profile", action="store_true", help="cProfile ckptio's save() and print the top")
    args = parser.parse_args()

    quiet_dcp()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    ensure_process_group()
    state = make_state(args.big, args.big_mib, args.tiny)
    nbytes = state_bytes(state)
    print(f"state: {args.big} x {args.big_mib} MiB + {args.tiny} tiny = {nbytes / MiB:.1f} MiB, "
          f"{len(state)} tensors; torch threads {torch.get_num_threads()}; reps {args.reps}")

    bw, every_s, big_s = copy_anchor(state, args.reps)
    anchor_a = nbytes / bw
    print(f"(a) copy_ into preallocated buffers: {bw / (1 << 30):.2f} GiB/s -> bytes/bw = {anchor_a * 1e3:.1f} ms "
          f"(copy_ of every tensor incl. tiny: {every_s * 1e3:.1f} ms; big only: {big_s * 1e3:.1f} ms)")

    with scratch_dir(args.dir, "ckptio-bench-save-") as root:
        dcp_s, dcp_times = bench_dcp(state, str(root), args.reps)
        print(f"(b) dcp.async_save returns:           {dcp_s * 1e3:8.1f} ms  {fmt_times(dcp_times)}")
        best_ret_s, best_rets, best_s, best_times = bench_dcp_best(state, str(root), args.reps)
        print(f"(c) DCP-best async_save returns:      {best_ret_s * 1e3:8.1f} ms  {fmt_times(best_rets)}")
        print(f"    DCP-best staging_completion:      {best_s * 1e3:8.1f} ms  {fmt_times(best_times)}")
        sync_s, sync_times = bench_dcp_sync(state, str(root), args.reps)
        print(f"(d) dcp.save returns:                 {sync_s * 1e3:8.1f} ms  {fmt_times(sync_times)}")
        events = str(root / "events.jsonl")
        ck_s, ck_times = bench_ckptio(state, str(root), args.reps, events, args.profile)
        print(f"    ckptio save() returns:            {ck_s * 1e3:8.1f} ms  {fmt_times(ck_times)}")
        recs = read_events(events)
        stage = sorted(e["seconds"] for e in recs if e["event"] == "stage_end" and e["step"] >= 1)
        if stage:
            print(f"    of which copy into the slot (stage_end, median): {stage[len(stage) // 2] * 1e3:.1f} ms; "
                  f"last step's phases: {phase_summary(recs, args.reps)}")

    vs_copy, vs_dcp, vs_best = ck_s / anchor_a, ck_s / dcp_s, ck_s / best_s
    print(f"ckptio / (a) copy_ = {vs_copy:.2f} ({verdict(vs_copy, 1.5, at_most=True)}); "
          f"ckptio / (b) dcp.async_save = {vs_dcp:.3f} ({verdict(vs_dcp, 0.3, at_most=True)}); "
          f"ckptio / (c) DCP-best time-to-mutable = {vs_best:.3f} ({verdict(vs_best, 1.0, at_most=True)}); "
          f"ckptio / (d) dcp.save = {ck_s / sync_s:.3f}")
    ratio_line(save_vs_copy=vs_copy, save_vs_dcp_async=vs_dcp, vs_dcp_best=vs_best,
               vs_dcp_best_return=ck_s / best_ret_s, vs_dcp_save=ck_s / sync_s, ckptio_ms=f"{ck_s * 1e3:.1f}",
               copy_ms=f"{anchor_a * 1e3:.1f}", dcp_async_ms=f"{dcp_s * 1e3:.1f}",
               dcp_best_mutable_ms=f"{best_s * 1e3:.1f}", dcp_save_ms=f"{sync_s * 1e3:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
