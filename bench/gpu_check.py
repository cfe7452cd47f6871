"""One prepared GPU check (< 5 minutes on one GPU): D2H bandwidth, ``save()`` return time, time-to-mutable vs DCP-best,
and restore into GPU targets vs plain ``dcp.load``.

Measured in one run, on one device, median of ``--reps`` after a warm-up save of each saver:

1. **D2H anchor**: ``torch.empty(n, pin_memory=True).copy_(gpu, non_blocking=True)`` + synchronize — the device's
   pinned-copy limit — and the same into pageable memory, for reference.
2. **ckptio**: a state of ``--big`` × ``--big-mib`` MiB tensors plus ``--tiny`` small ones, on the GPU; the time
   ``save()`` takes to return, and the time until the state may be mutated (``save()`` + ``wait_staged()`` where
   the handle has it, else the return itself: staging is synchronous); the effective D2H GB/s of staging.
3. **DCP-best**: ``dcp.async_save`` with ``AsyncCheckpointerType.PROCESS`` and ``DefaultStager(StagingOptions(
   use_pinned_memory, use_shared_memory, use_async_staging, use_non_blocking_copy))``, all four on; its
   time-to-mutable is when ``staging_completion`` resolves.

4. **Restore into GPU tensors**: ``Checkpointer.restore`` of the last save into fresh GPU targets (ranges read into
   pinned bounce buffers, copied non-blocking on a side stream) against ``dcp.load`` of a ``dcp.save`` copy, both
   from the page cache (warm: the check is the host-to-device path, not the disk); bit-exactness checked; the
   anchor is a pinned H2D copy of the state.

Each save's flush is waited for (untimed) before the next, so a rep measures staging, not queueing. Slots go to
/dev/shm unless it is too small for them (a container's default 64 MiB), then to the scratch directory
(``staging_dir=``). Without CUDA it prints why and exits 0; ``--cpu-dry-run`` runs the same code on CPU tensors
(small sizes, pinned memory and non-blocking copies off as DCP requires there) to check the script itself.

    python bench/gpu_check.py [--big 16] [--big-mib 128] [--tiny 2000] [--reps 3] [--dir /tmp] [--cpu-dry-run]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

GB = 1e9
MiB = 1 << 20


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def d2h_anchor(nbytes: int, device: str, reps: int) -> tuple[float, float]:
    """GB/s of one device→host copy into pinned memory (non_blocking + sync) and into pageable memory."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device == "cuda")
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pageable.fill_(0)  # touched: a copy into fresh pages measures page faults, not the link
    out = []
    for dst in (pinned, pageable):
        times = []
        for _ in range(reps + 1):
            sync(device)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=dst.is_pinned())
            sync(device)
            times.append(time.perf_counter() - t0)
        out.append(nbytes / statistics.median(times[1:]) / GB)
    return out[0], out[1]


def make_state(big: int, big_mib: int, tiny: int, device: str) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(0)
    state = {f"big.{i}": torch.rand(big_mib * MiB // 4, generator=gen, device=device) for i in range(big)}
    state.update({f"tiny.{i}": torch.rand(16, generator=gen, device=device) for i in range(tiny)})
    return state


def staging_dir_for(nbytes: int, scratch: str) -> str | None:
    """/dev/shm when it holds the slot with room to spare, else a directory in the scratch space."""
    if os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > 2 * nbytes:
            return None
    path = os.path.join(scratch, "staging")
    os.makedirs(path, exist_ok=True)
    print(f"/dev/shm is too small for a {nbytes / GB:.2f} GB slot: staging in {path}")
    return path


def run_ckptio(state: dict[str, Any], nbytes: int, scratch: str, device: str, reps: int) -> tuple[float, float]:
    """Median seconds to ``save()`` return and to mutable."""
    from ckptio import Checkpointer

    returns, mutable = [], []
    with Checkpointer(os.path.join(scratch, "ckptio"), max_pending=1, keep_last=1, fsync=False, lease_s=0,
                      staging_dir=staging_dir_for(nbytes, scratch)) as ck:
        assert ck.writer_ready(300), "the ckptio writer did not start"
        for step in range(reps + 1):
            sync(device)
            t0 = time.perf_counter()
            handle = ck.save(step, state)
            t_ret = time.perf_counter()
            wait_staged = getattr(handle, "wait_staged", None)
            if wait_staged is not None:
                wait_staged()
            t_mut = time.perf_counter()
            handle.wait(600)
            if step:  # step 0 is the warm-up (planning, slot allocation)
                returns.append(t_ret - t0)
                mutable.append(t_mut - t0)
    return statistics.median(returns), statistics.median(mutable)


def run_restore(state: dict[str, Any], scratch: str, device: str, reps: int) -> tuple[float, float, bool]:
    """Median seconds of ckptio's restore and of dcp.load into targets on ``device``, and whether ckptio's values
    are bit-exact (run after :func:`run_ckptio`, whose last save holds ``state``)."""
    import torch.distributed.checkpoint as dcp

    from ckptio import Checkpointer

    plain = os.path.join(scratch, "dcp-plain")
    dcp.save(state, checkpoint_id=plain)
    target = {k: torch.empty_like(v) for k, v in state.items()}
    times: dict[str, list[float]] = {"ckptio": [], "dcp": []}
    with Checkpointer(os.path.join(scratch, "ckptio"), fsync=False, lease_s=0) as ck:
        for rep in range(reps + 1):
            for name, seen in times.items():
                for t in target.values():
                    t.zero_()
                sync(device)
                t0 = time.perf_counter()
                ck.restore(target) if name == "ckptio" else dcp.load(target, checkpoint_id=plain)
                sync(device)
                if rep:
                    seen.append(time.perf_counter() - t0)
        for t in target.values():
            t.zero_()
        ck.restore(target)
    ok = all(torch.equal(target[k].view(torch.uint8), v.view(torch.uint8)) for k, v in state.items())
    return statistics.median(times["ckptio"]), statistics.median(times["dcp"]), ok


def h2d_pinned(nbytes: int, device: str, reps: int) -> float:
    """GB/s of one host→device copy from pinned memory (non_blocking + sync): the restore's anchor."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device == "cuda").fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(reps + 1):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=device == "cuda")
        sync(device)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times[1:]) / GB


def init_single_rank_group() -> None:
    """DCP's PROCESS checkpointer copies the caller's process group into its background process: give it one."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)


def run_dcp_best(state: dict[str, Any], scratch: str, device: str, reps: int) -> tuple[float, float]:
    """Median seconds to ``async_save`` return and to ``staging_completion``."""
    import torch.distributed.checkpoint as dcp

    from ckptio.demo.dcp_best import DcpBest

    # All four staging options on with CUDA; on CPU pinned memory and non-blocking copies are off (DCP asserts).
    best = DcpBest(accelerator=device == "cuda")
    returns, mutable = [], []
    try:
        for step in range(reps + 1):
            target = os.path.join(scratch, "dcp", f"step-{step}")
            sync(device)
            t0 = time.perf_counter()
            best.save(state, dcp.FileSystemWriter(target))
            t_ret = time.perf_counter()
            best.wait_staged()
            t_mut = time.perf_counter()
            best.wait()
            shutil.rmtree(target, ignore_errors=True)
            if step:
                returns.append(t_ret - t0)
                mutable.append(t_mut - t0)
    finally:
        best.close()
    return statistics.median(returns), statistics.median(mutable)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big", type=int, default=16)
    ap.add_argument("--big-mib", type=int, default=128)
    ap.add_argument("--tiny", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--cpu-dry-run", action="store_true", help="run on CPU with small sizes to check the script")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.cpu_dry_run:
        print("gpu_check: no CUDA device here: nothing to measure (run it on a GPU host; --cpu-dry-run checks the "
              "script on CPU)")
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        args.big, args.big_mib, args.tiny, args.reps = min(args.big, 4), min(args.big_mib, 8), min(args.tiny, 100), 1
    else:
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  CUDA {torch.version.cuda}")
    import warnings

    warnings.filterwarnings("ignore")  # DCP warns about single-process use on every save
    scratch = tempfile.mkdtemp(prefix="ckptio-gpu-check-", dir=args.dir)
    try:
        state = make_state(args.big, args.big_mib, args.tiny, device)
        nbytes = sum(t.nbytes for t in state.values())
        pinned_gbps, pageable_gbps = d2h_anchor(args.big * args.big_mib * MiB, device, args.reps)
        copy_s = nbytes / (pinned_gbps * GB)
        ck_ret, ck_mut = run_ckptio(state, nbytes, scratch, device, args.reps)
        init_single_rank_group()
        restore_s, dcp_load_s, restore_ok = run_restore(state, scratch, device, args.reps)
        h2d_gbps = h2d_pinned(args.big * args.big_mib * MiB, device, args.reps)
        dcp_ret, dcp_mut = run_dcp_best(state, scratch, device, args.reps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"state: {nbytes / GB:.3f} GB ({args.big} x {args.big_mib} MiB + {args.tiny} tiny) on {device}")
    print(f"D2H pinned copy (anchor)   {pinned_gbps:8.2f} GB/s   pageable {pageable_gbps:8.2f} GB/s   "
          f"copy of the state at the anchor rate {copy_s * 1e3:8.1f} ms")
    print(f"ckptio   save() returns    {ck_ret * 1e3:8.1f} ms   time-to-mutable {ck_mut * 1e3:8.1f} ms   "
          f"staging D2H {nbytes / ck_mut / GB:8.2f} GB/s")
    print(f"DCP-best async_save returns {dcp_ret * 1e3:7.1f} ms   staging_completion {dcp_mut * 1e3:8.1f} ms")
    print(f"restore into {device}: ckptio {restore_s * 1e3:8.1f} ms ({nbytes / restore_s / GB:.2f} GB/s, bit-exact "
          f"{restore_ok})   dcp.load {dcp_load_s * 1e3:8.1f} ms   H2D pinned (anchor) {h2d_gbps:.2f} GB/s")
    from _common import ratio_line

    ratio_line(
        device=device,
        d2h_pinned_gbps=pinned_gbps,
        ckptio_d2h_vs_pinned=nbytes / ck_mut / GB / pinned_gbps,
        save_return_vs_copy=ck_ret / copy_s,
        ttm_vs_copy=ck_mut / copy_s,
        ttm_vs_dcp_best=ck_mut / dcp_mut,
        save_return_vs_dcp_best_return=ck_ret / dcp_ret,
        restore_vs_dcp_load=restore_s / dcp_load_s,
        restore_vs_h2d_pinned=nbytes / restore_s / GB / h2d_gbps,
        restore_bit_exact=str(restore_ok),
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, run from anywhere
    sys.exit(main())
