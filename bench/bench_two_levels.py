"""Two levels in the engine (issue 10): restore after losing a node, and the local level's cost to training.

1. Restore after losing one node. Two gloo ranks on two "nodes" (``node_id``), ``--mib`` MiB of state each, the
   durable store throttled to ``--mbps`` MiB/s shared by every process (reads and writes,
   ``ckptio.testing.wrappers.ThrottledStorage``). The job saves steps 1..3 with ``durable_every=2`` (durable step
   2, local-level step 3), node n1's local dir is deleted, and a fresh job restores:
   - ckptio: ``Checkpointer.restore()`` (own local copy on n0, the partner's copy over TCP for n1), step 3;
   - anchor: plain ``torch.distributed.checkpoint.load`` of the durable step 2 through the same throttled store
     (ckptio's StorageReader over the throttled durable root, no local tier: DCP's own load path).
   Both bit-exact (checked). Goal: anchor ÷ ckptio ≥ 5.
2. The local level's cost to training: the same 2-rank loop (a fixed CPU step, a save every ``--every`` steps) with
   durable-only saves (``durable_every=1``, local tier on) and with local-level saves replicated to a partner
   (``durable_every`` huge), against the loop without saves. Time lost per save = (loop − loop without saves) ÷
   saves, medians of ``--reps``. Goal: local ÷ durable-only ≤ 1.1.

    .venv/bin/python bench/bench_two_levels.py [--mib 64] [--mbps 50] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from _common import quiet_dcp, ratio_line, scratch_dir, verdict
from ckptio import Checkpointer
from ckptio.engine.restore.storage_reader import CkptioStorageReader
from ckptio.storage import open_storage
from ckptio.testing.ranks import run_ranks
from ckptio.testing.wrappers import ThrottledStorage

MiB = 1 << 20
NODES = ["n0", "n1"]


def state_for(step: int, rank: int, mib: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {f"w{rank}": torch.randn(mib * MiB // 4 // 1024, 1024, generator=g), "step": step}


def blank(rank: int, mib: int) -> dict[str, Any]:
    return {f"w{rank}": torch.zeros(mib * MiB // 4 // 1024, 1024), "step": -1}


def throttled(base: Path, mbps: float) -> ThrottledStorage:
    return ThrottledStorage(open_storage(str(base / "root"), fsync=False), write_bytes_per_s=mbps * MiB,
                            read_bytes_per_s=mbps * MiB, state_path=str(base / "throttle"))


def _options(base: Path, rank: int, **extra: Any) -> dict[str, Any]:
    return dict(local_dir=str(base / f"local-{NODES[rank]}"), node_id=NODES[rank], lease_s=0, fsync=False,
                volume_check="off", keep_last=2, **extra)


def _save_phase(rank: int, world: int, base: Path, mib: int, mbps: float) -> None:
    os.environ["CKPTIO_PARTNER_HOST"] = "127.0.0.1"
    with Checkpointer(throttled(base, mbps), **_options(base, rank, durable_every=2)) as ck:
        for step in (1, 2, 3):
            ck.save(step, state_for(step, rank, mib)).wait()


def _restore_phase(rank: int, world: int, base: Path, mib: int, mbps: float) -> None:
    os.environ["CKPTIO_PARTNER_HOST"] = "127.0.0.1"
    out: dict[str, Any] = {}
    with Checkpointer(throttled(base, mbps), **_options(base, rank, durable_every=2)) as ck:
        ck.writer_ready(120)  # the partner servers are up: what a restore after relaunch waits for is the read
        dist.barrier()
        target = blank(rank, mib)
        t0 = time.perf_counter()
        step = ck.restore(target)
        out["levels_s"] = time.perf_counter() - t0
        out["levels_step"], out["levels_sources"] = step, ck.last_restore.sources if ck.last_restore else None
        out["levels_exact"] = bool(torch.equal(target[f"w{rank}"], state_for(3, rank, mib)[f"w{rank}"]))
        dist.barrier()
        target = blank(rank, mib)
        reader = CkptioStorageReader(throttled(base, mbps), 2)
        t0 = time.perf_counter()
        dcp.load(target, storage_reader=reader, process_group=ck.group.group)
        out["dcp_s"] = time.perf_counter() - t0
        out["dcp_exact"] = bool(torch.equal(target[f"w{rank}"], state_for(2, rank, mib)[f"w{rank}"]))
    (base / f"restore-{rank}.json").write_text(json.dumps(out))


def figure_restore(args: argparse.Namespace) -> tuple[float, bool]:
    with scratch_dir(args.dir, "ckptio-2lvl-") as base:
        run_ranks(2, _save_phase, base, args.mib, args.mbps)
        shutil.rmtree(base / "local-n1")  # node n1 is lost: it comes back with an empty local disk
        run_ranks(2, _restore_phase, base, args.mib, args.mbps)
        results = [json.loads((base / f"restore-{r}.json").read_text()) for r in range(2)]
    levels_s = max(r["levels_s"] for r in results)  # the job is restored when its slowest rank is
    dcp_s = max(r["dcp_s"] for r in results)
    exact = all(r["levels_exact"] and r["dcp_exact"] and r["levels_step"] == 3 for r in results)
    print(f"restore after losing node n1 ({args.mib} MiB/rank, durable throttled to {args.mbps:g} MiB/s):")
    for r, res in enumerate(results):
        print(f"  rank {r}: ckptio step {res['levels_step']} in {res['levels_s']:.2f} s from {res['levels_sources']}"
              f"; dcp.load durable step 2 in {res['dcp_s']:.2f} s")
    speedup = dcp_s / levels_s
    print(f"  job: ckptio {levels_s:.2f} s, dcp.load {dcp_s:.2f} s: {speedup:.1f}x, bit-exact={exact} "
          f"({verdict(speedup, 5.0, at_most=False)})")
    return speedup, exact


def _loop(rank: int, world: int, base: Path, mode: str, shape: tuple[int, int, int]) -> None:
    steps, every, mib = shape
    os.environ["CKPTIO_PARTNER_HOST"] = "127.0.0.1"
    torch.set_num_threads(1)
    a = torch.randn(384, 384)
    extra = {"durable_every": 1} if mode == "durable" else {"durable_every": 1_000_000}
    ck = Checkpointer(str(base / mode / "root"), **_options(base / mode, rank, **extra)) if mode != "none" else None
    if ck is not None:
        ck.writer_ready(120)
    state = state_for(1, rank, mib)
    dist.barrier()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        for _ in range(6):
            a = (a @ a).tanh()  # a fixed CPU step
        if ck is not None and step % every == 0:
            ck.save(step, state)
    if ck is not None:
        ck.wait()
    dist.barrier()
    wall = time.perf_counter() - t0
    if ck is not None:
        ck.close()
    if rank == 0:
        (base / f"loop-{mode}.json").write_text(json.dumps({"wall": wall}))


def figure_cost(args: argparse.Namespace) -> float:
    steps, every = 60, 4
    lost: dict[str, list[float]] = {"durable": [], "local": []}
    with scratch_dir(args.dir, "ckptio-2lvl-cost-") as base:
        for rep in range(args.reps):
            walls = {}
            for mode in ("none", "durable", "local"):
                (base / str(rep)).mkdir(parents=True, exist_ok=True)
                run_ranks(2, _loop, base / str(rep), mode, (steps, every, args.cost_mib))
                walls[mode] = json.loads((base / str(rep) / f"loop-{mode}.json").read_text())["wall"]
            for mode in ("durable", "local"):
                lost[mode].append(max(0.0, walls[mode] - walls["none"]) / (steps // every))
            print(f"  rep {rep}: loop without saves {walls['none']:.2f} s, durable-only {walls['durable']:.2f} s, "
                  f"local+partner {walls['local']:.2f} s")
    d, loc = statistics.median(lost["durable"]), statistics.median(lost["local"])
    ratio = loc / d if d > 0 else float("inf")
    print(f"time lost per save ({args.cost_mib} MiB/rank): durable-only {d * 1e3:.1f} ms, local level + partner "
          f"{loc * 1e3:.1f} ms: {ratio:.2f}x ({verdict(ratio, 1.1, at_most=True)})")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="state per rank for the restore figure")
    parser.add_argument("--cost-mib", type=int, default=32, help="state per rank for the cost figure")
    parser.add_argument("--mbps", type=float, default=50.0, help="durable store bandwidth (MiB/s, shared)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch parent directory")
    parser.add_argument("--skip-cost", action="store_true")
    args = parser.parse_args()
    quiet_dcp()
    speedup, exact = figure_restore(args)
    ratios: dict[str, float | str] = {"restore_speedup_vs_dcp_load": speedup, "bit_exact": str(exact).lower()}
    if not args.skip_cost:
        ratios["local_save_cost_vs_durable_only"] = figure_cost(args)
    ratio_line(**ratios)


if __name__ == "__main__":
    main()
