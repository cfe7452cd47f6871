"""``save()`` return time and time-to-mutable: ckptio (async staging) vs a copy and vs DCP's best async mode.

One process. The state is ``--big`` fp32 tensors of ``--big-mib`` MiB plus ``--tiny`` tiny tensors (default
16 x 32 MiB + 2,000 = 512 MiB). Three figures from the same run, medians of ``--reps`` after one warm-up:

* anchor: ``torch._foreach_copy_`` of every tensor into preallocated, already-touched buffers (the copy a save
  cannot avoid);
* ckptio: the time ``save()`` returns, and the time until ``wait_staged()`` returns (time-to-mutable: what the
  guard's optimizer pre-hook waits for);
* DCP-best: ``dcp.async_save`` with ``AsyncCheckpointerType.PROCESS`` and ``DefaultStager(StagingOptions(
  use_pinned_memory, use_shared_memory=True, use_async_staging=True, use_non_blocking_copy))`` (pinned and
  non-blocking only with CUDA, as DCP requires), one stager reused across saves; time-to-mutable is
  ``staging_completion``.

Between reps every background flush is waited for (untimed). Goals (issue 08): save() return <= 0.25 x the copy;
time-to-mutable <= 1.5 x the copy and <= 1.0 x DCP-best's staging_completion.

    .venv/bin/python bench/bench_time_to_mutable.py [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import MiB, fmt_times, make_state, quiet_dcp, ratio_line, scratch_dir, state_bytes, verdict


def copy_anchor(state: dict, reps: int) -> float:
    import torch

    srcs = list(state.values())
    dsts = [torch.empty_like(t).fill_(0) for t in srcs]  # touched: no page faults inside the timing
    times = []
    for rep in range(-1, reps):
        t0 = time.perf_counter()
        with torch.no_grad():
            torch._foreach_copy_(dsts, srcs)
        if rep >= 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_ckptio(state: dict, root: str, reps: int) -> tuple[list[float], list[float]]:
    import ckptio

    returned, mutable = [], []
    with ckptio.Checkpointer(os.path.join(root, "ckptio"), max_pending=1, keep_last=2, fsync=False) as ck:
        for rep in range(-1, reps):  # step 0 is the warm-up: boots the writer, plans, allocates the slot
            t0 = time.perf_counter()
            handle = ck.save(rep + 1, state)
            t1 = time.perf_counter()
            ck.wait_staged()
            t2 = time.perf_counter()
            handle.wait()
            if rep >= 0:
                returned.append(t1 - t0)
                mutable.append(t2 - t0)
    return returned, mutable


def bench_dcp_best(state: dict, root: str, reps: int) -> tuple[list[float], list[float]]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ckptio.demo.dcp_best import DcpBest
    from ckptio.testing.ranks import free_port

    # The PROCESS checkpointer needs a process group even for one rank (after ckptio ran: it measures without one).
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    best = DcpBest(accelerator=any(t.is_cuda for t in state.values()))
    returned, mutable = [], []
    try:
        for rep in range(-1, reps):
            t0 = time.perf_counter()
            best.save(state, dcp.FileSystemWriter(os.path.join(root, f"dcp-{rep + 1}")))
            t1 = time.perf_counter()
            best.wait_staged()
            t2 = time.perf_counter()
            best.wait()
            if rep >= 0:
                returned.append(t1 - t0)
                mutable.append(t2 - t0)
    finally:
        best.close()
        dist.destroy_process_group()
    return returned, mutable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=16, help="number of large tensors")
    parser.add_argument("--big-mib", type=int, default=32, help="MiB per large tensor")
    parser.add_argument("--tiny", type=int, default=2000, help="number of 16-element tensors")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    parser.add_argument("--skip-dcp", action="store_true", help="ckptio and the anchor only")
    args = parser.parse_args()

    quiet_dcp()
    state = make_state(args.big, args.big_mib, args.tiny)
    nbytes = state_bytes(state)
    print(f"state: {args.big} x {args.big_mib} MiB + {args.tiny} tiny = {nbytes / MiB:.1f} MiB, "
          f"{len(state)} tensors; reps {args.reps}")
    copy_s = copy_anchor(state, args.reps)
    print(f"anchor: _foreach_copy_ into preallocated buffers: {copy_s * 1e3:8.1f} ms")
    with scratch_dir(args.dir, "ckptio-bench-ttm-") as root:
        ck_ret, ck_mut = bench_ckptio(state, str(root), args.reps)
        print(f"ckptio   save() returns:          {statistics.median(ck_ret) * 1e3:8.1f} ms  {fmt_times(ck_ret)}")
        print(f"ckptio   time-to-mutable:         {statistics.median(ck_mut) * 1e3:8.1f} ms  {fmt_times(ck_mut)}")
        dcp_mut_s = None
        if not args.skip_dcp:
            dcp_ret, dcp_mut = bench_dcp_best(state, str(root), args.reps)
            dcp_mut_s = statistics.median(dcp_mut)
            print(f"DCP-best async_save returns:      {statistics.median(dcp_ret) * 1e3:8.1f} ms  {fmt_times(dcp_ret)}")
            print(f"DCP-best staging_completion:      {dcp_mut_s * 1e3:8.1f} ms  {fmt_times(dcp_mut)}")
    ret_vs_copy = statistics.median(ck_ret) / copy_s
    mut_vs_copy = statistics.median(ck_mut) / copy_s
    print(f"save() return / copy = {ret_vs_copy:.3f} ({verdict(ret_vs_copy, 0.25, at_most=True)}); "
          f"time-to-mutable / copy = {mut_vs_copy:.3f} ({verdict(mut_vs_copy, 1.5, at_most=True)})")
    ratios: dict[str, float | str] = {"return_vs_copy": ret_vs_copy, "mutable_vs_copy": mut_vs_copy}
    if dcp_mut_s is not None:
        mut_vs_dcp = statistics.median(ck_mut) / dcp_mut_s
        print(f"time-to-mutable / DCP-best staging_completion = {mut_vs_dcp:.3f} "
              f"({verdict(mut_vs_dcp, 1.0, at_most=True)})")
        ratios["mutable_vs_dcp_best"] = mut_vs_dcp
        ratios["dcp_best_staging_ms"] = f"{dcp_mut_s * 1e3:.1f}"
    ratio_line(**ratios, copy_ms=f"{copy_s * 1e3:.1f}", ckptio_return_ms=f"{statistics.median(ck_ret) * 1e3:.1f}",
               ckptio_mutable_ms=f"{statistics.median(ck_mut) * 1e3:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
