"""Planner truth: plan this machine's own burst from a probe profile, then measure the same burst with ckptio.

Anchor: the flush time of real ckptio saves (2 gloo ranks, each saving ``--mib-per-rank`` to the work disk,
fsynced), median of several saves after a warm-up. ckptio figure: ``ckptio plan``'s flush time for the same
job, from a ``ckptio probe`` profile of the same directory taken in the same run. Goal: within 20%.

    .venv/bin/python bench/bench_planner.py [--ranks 2] [--mib-per-rank 512] [--saves 4] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import RunSpec, median_figure, ratio_line, run_job
from ckptio.plan.budget import Schedule, StorageModel, plan_burst
from ckptio.plan.host import measure_copy_bandwidth
from ckptio.plan.model import uniform_shape
from ckptio.plan.probe import ProbeConfig, probe

MIB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mib-per-rank", type=int, default=512)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--probe-seconds", type=float, default=30.0)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="ckptio-bench-planner-", dir=args.dir)
    try:
        bytes_per_rank = args.mib_per_rank * MIB
        # 1. the store's profile, files shaped like the job's (one file per rank, all ranks at once)
        config = ProbeConfig(writers=args.ranks, file_size_bytes=bytes_per_rank, files_per_writer=2,
                             max_seconds=args.probe_seconds)
        profile = probe(os.path.join(workdir, "probe"), config)
        # 2. the plan for the job: each rank writes its state as one file
        shape = uniform_shape(ranks=args.ranks, bytes_per_rank=bytes_per_rank)
        storage = StorageModel(write_bytes_per_s=profile.write_bytes_per_s,
                               per_writer_bytes_per_s=profile.per_writer_bytes_per_s,
                               metadata_ops_per_s=profile.metadata_ops_per_s,
                               serialize_bytes_per_s=profile.serialize_bytes_per_s or float("inf"))
        copy = measure_copy_bandwidth()
        plan = plan_burst(shape, storage, Schedule(interval_s=3600, d2h_bytes_per_s=copy))
        plan_store_s = plan.flush_s - shape.bytes_per_rank_max / storage.serialize_bytes_per_s
        # 3. the same burst, measured: saves far enough apart that each flush runs alone
        interval = max(3.0 * plan.flush_s, 5.0)
        spec = RunSpec(ranks=args.ranks, bytes_per_rank=bytes_per_rank, saves=args.saves, interval_s=interval,
                       root=os.path.join(workdir, "ckpt"), events_dir=os.path.join(workdir, "events"))
        saves = run_job(spec)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    measured_commit, measured_flush = median_figure(saves, "commit_s"), median_figure(saves, "flush_s")
    measured_block = median_figure(saves, "blocking_s")
    print(f"probe profile: write {profile.write_bytes_per_s / MIB:.0f} MiB/s aggregate "
          f"({profile.per_writer_bytes_per_s / MIB:.0f} MiB/s one writer), serialize "
          f"{(profile.serialize_bytes_per_s or 0) / MIB:.0f} MiB/s per writer, {profile.seconds:.1f} s")
    print(f"plan: flush {plan.flush_s:.2f} s = serialize {plan.flush_s - plan_store_s:.2f} s + store "
          f"{plan_store_s:.2f} s ({plan.bottleneck})")
    print(f"job: {args.ranks} ranks × {args.mib_per_rank} MiB, {args.saves} saves every {interval:.1f} s")
    print(f"{'':34}{'measured (anchor)':>20}{'plan':>10}")
    print(f"{'flush to commit (s, median)':34}{measured_commit:>20.2f}{plan.flush_s:>10.2f}")
    print(f"{'flush as rank 0 reports it':34}{measured_flush:>20.2f}")
    print(f"{'blocking (s, median)':34}{measured_block:>20.3f}{plan.blocking_s:>10.3f}")
    commits = ", ".join(f"{s['commit_s']:.2f}" for s in saves)
    print(f"per-save flush to commit (s): {commits}")
    print(f"measured writer phases (median, slowest rank): serialize {median_figure(saves, 'serialize'):.2f} s, "
          f"upload {median_figure(saves, 'upload'):.2f} s, "
          f"retention after the commit {median_figure(saves, 'retention'):.2f} s")
    ratio = plan.flush_s / measured_commit
    verdict = "met" if 0.8 <= ratio <= 1.2 else "MISSED"
    print(f"ratio plan/measured flush to commit: {ratio:.2f} (goal 0.80-1.20: {verdict})")
    ratio_line(plan_over_measured_flush=ratio, plan_over_reported_flush=plan.flush_s / measured_flush)
    return 0


if __name__ == "__main__":
    sys.exit(main())
