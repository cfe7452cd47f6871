"""Restore: bandwidth against fio and plain ``dcp.load``, read amplification across ranks, S3 against the best
client, and peak memory — each ratio from one run, its anchor measured in the same run.

1. **One process, cold page cache.** A state of ``--tensors`` fp32 tensors (``--mib`` MiB in all) saved by ckptio
   and, separately, by ``dcp.save``. Each rep drops the page cache (``echo 1 > /proc/sys/vm/drop_caches`` when
   root, else ``posix_fadvise(DONTNEED)`` on every file read; the header says which) before each of: fio reading
   a file of the same size (``--rw=read --direct=1 --ioengine=libaio --iodepth=8``, the best of ``--fio-bs``),
   ``Checkpointer.restore`` and ``dcp.load`` of the dcp.save copy. Reps rotate the order. Medians of ``--reps``.
   The planner's line: ``plan --json``'s ``restore_s.durable`` for this job (one rank, the state's bytes) on a store
   that reads at fio's bandwidth (``ckptio.plan.costs.readback``), against the measured restore (the bar: within
   20 %).
2. **Replicated, 2 and 4 ranks.** Every rank holds the same ``--ranks-mib`` MiB; saved by that many ranks (DCP
   writes each tensor once), restored by as many. Store bytes ÷ checkpoint bytes, summed over ranks: ckptio's as
   counted by a storage wrapper and by ``/proc/self/io`` rchar (gloo's socket receives are not in rchar: the
   ``socket rchar`` column shows what 64 MiB received over gloo added), DCP's by rchar.
3. **Reshard.** Saved by 2 ranks as FSDP2 lays parameters out (DTensor ``Shard(0)``), restored at 1 and 4:
   store bytes ÷ the bytes the ranks need (their shards).
4. **S3** (a local moto server in its own process): ckptio restore of ``--s3-mib`` MiB against boto3's
   ``download_fileobj`` and ``s5cmd cp`` of the same data objects into /dev/shm (the best of the two).
5. **Memory.** A ``--mem-mib`` MiB restore in a fresh process: peak RSS (VmHWM, reset just before) above the RSS
   with the state allocated, against 256 MiB.

    .venv/bin/python bench/bench_restore.py [--mib 512] [--reps 3] [--dir DIR] [--skip s3,memory]

Ends with ``RATIOS restore_vs_fio= restore_vs_dcp_load= restore_predicted_vs_measured= replicated_read_amplification_2=
replicated_read_amplification_4= reshard_read_amplification= s3_vs_best_client= memory_extra_mib=``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _restore_ranks as ranks
from _common import (
    MiB,
    device_of,
    fmt_times,
    make_state,
    quiet_dcp,
    ratio_line,
    scratch_dir,
    start_moto,
    state_bytes,
    verdict,
)
from ckptio.plan.measure.disk import drop_page_cache


def files_under(*dirs: str) -> list[str]:
    return [p for d in dirs for p in glob.glob(os.path.join(d, "**"), recursive=True) if os.path.isfile(p)]


def fio_read(path: str, nbytes: int, bs: str) -> float:
    """Seconds fio takes to read ``path`` sequentially with O_DIRECT, libaio, iodepth 8."""
    cmd = ["fio", "--name=r", "--rw=read", "--direct=1", "--ioengine=libaio", "--iodepth=8", f"--bs={bs}",
           f"--size={nbytes}", f"--filename={path}", "--output-format=json"]
    doc = json.loads((out := subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)[out.index("{"):])
    return nbytes / float(doc["jobs"][0]["read"]["bw_bytes"])


def posix_one_process(args: argparse.Namespace, base: Path) -> tuple[float, float, float]:
    import torch
    import torch.distributed.checkpoint as dcp

    import ckptio

    state = make_state(args.tensors, args.mib // args.tensors, 0)
    nbytes = state_bytes(state)
    ck_root, dcp_dir, fio_file = str(base / "ck"), str(base / "dcp"), str(base / "fio.bin")
    with ckptio.Checkpointer(ck_root) as ck:
        ck.save(1, state).wait(timeout=600)
    dcp.save(state, checkpoint_id=dcp_dir)
    subprocess.run(["fio", "--name=w", "--rw=write", "--bs=16M", f"--size={nbytes}", f"--filename={fio_file}",
                    "--end_fsync=1", "--output-format=json"], check=True, capture_output=True)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    del state
    times: dict[str, list[float]] = {"fio": [], "ckptio": [], "dcp.load": []}
    how = ""
    with ckptio.Checkpointer(ck_root) as ck:
        def run(which: str) -> float:
            nonlocal how
            how = drop_page_cache([*files_under(ck_root, dcp_dir), fio_file])
            if which == "fio":
                return min(fio_read(fio_file, nbytes, bs) for bs in args.fio_bs.split(","))
            t0 = time.perf_counter()
            if which == "ckptio":
                ck.restore(target)
            else:
                dcp.load(target, checkpoint_id=dcp_dir)
            return time.perf_counter() - t0

        order = list(times)
        for rep in range(args.reps + 1):  # rep 0 warms imports and clients up
            for which in order[rep % 3 :] + order[: rep % 3]:
                t = run(which)
                if rep:
                    times[which].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n[1] one process, {nbytes / MiB:.0f} MiB in {args.tensors} tensors, cold cache by {how}")
    for k, v in times.items():
        print(f"  {k:<10} {nbytes / med[k] / MiB:8.0f} MiB/s  {fmt_times(v)}")
    vs_fio, vs_dcp = med["fio"] / med["ckptio"], med["ckptio"] / med["dcp.load"]
    print(f"  restore bandwidth ÷ fio's = {vs_fio:.2f} ({verdict(vs_fio, 0.9, at_most=False)}); "
          f"restore time ÷ dcp.load's = {vs_dcp:.2f} ({verdict(vs_dcp, 0.7, at_most=True)})")
    predicted = planned_restore_s(nbytes, ranks=1, read_bytes_per_s=nbytes / med["fio"])
    vs_plan = predicted / med["ckptio"]
    print(f"  planner: restore_s.durable {predicted:.3f} s (fio's {nbytes / med['fio'] / MiB:.0f} MiB/s as the "
          f"store's read bandwidth), measured {med['ckptio']:.3f} s: predicted ÷ measured = {vs_plan:.2f} "
          f"({'within' if abs(vs_plan - 1) <= 0.2 else 'MISSES the bar of'} 20 %)")
    return vs_fio, vs_dcp, vs_plan


def planned_restore_s(nbytes: int, *, ranks: int, read_bytes_per_s: float) -> float:
    """``plan --json``'s ``restore_s.durable`` for ``ranks`` ranks of ``nbytes`` each on a store that reads at
    ``read_bytes_per_s`` (the write bandwidth plays no part in it)."""
    from ckptio.plan.costs.budget import plan_burst
    from ckptio.plan.costs.intervals import Schedule
    from ckptio.plan.costs.store import StoreLimits
    from ckptio.plan.job.checkpoint import uniform_shape

    shape = uniform_shape(ranks=ranks, bytes_per_rank=float(nbytes))
    storage = StoreLimits(write_bytes_per_s=read_bytes_per_s, read_bytes_per_s=read_bytes_per_s)
    restore = plan_burst(shape, storage, Schedule(interval_s=3600.0)).restore_s["durable"]
    assert restore is not None  # a read bandwidth is given
    return restore


def multi_rank(args: argparse.Namespace, base: Path) -> dict[str, float]:
    from ckptio.testing.ranks import run_ranks

    out: dict[str, float] = {}
    cases = [("replicated", n, n) for n in (2, 4)] + [("sharded", 2, 1), ("sharded", 2, 4)]
    print(f"\n[2,3] store bytes across ranks ({args.ranks_mib} MiB; ckptio: wrapper | rchar; DCP: rchar)")
    for kind, saved_by, restored_by in cases:
        root, res = base / f"{kind}-{saved_by}", base / f"res-{kind}-{restored_by}"
        res.mkdir(exist_ok=True)
        spec = {"root": str(root), "kind": kind, "mib": args.ranks_mib, "tensors": args.tensors, "out": str(res)}
        if not root.exists():
            run_ranks(saved_by, ranks.save, spec)
        run_ranks(restored_by, ranks.restore, spec)
        rows = [json.loads((res / f"{kind}-{restored_by}-{r}.json").read_text()) for r in range(restored_by)]
        total = json.loads((root / "step-00000001" / "manifest.json").read_text())["total_bytes"]
        base_bytes = total if kind == "replicated" else sum(r["needed"] for r in rows)
        store = sum(r["ckptio_store_bytes"] for r in rows) / base_bytes
        by_rchar = sum(r["ckptio_rchar"] for r in rows) / base_bytes
        by_dcp = sum(r["dcp_rchar"] for r in rows) / base_bytes
        print(f"  {kind:<10} saved by {saved_by}, restored by {restored_by}: ckptio {store:.3f} | {by_rchar:.3f}, "
              f"DCP {by_dcp:.3f}; per-rank store MiB {[round(r['ckptio_store_bytes'] / MiB) for r in rows]}; "
              f"socket rchar {rows[-1]['socket_rchar']}; values ok {all(r['ok'] for r in rows)}")
        key = f"replicated_read_amplification_{restored_by}" if kind == "replicated" else "reshard"
        out[key] = max(out.get(key, 0.0), store, by_rchar)
    print(f"  reshard (worst of 1 and 4 ranks): {out['reshard']:.3f} ({verdict(out['reshard'], 1.2, at_most=True)})")
    return out


def s3(args: argparse.Namespace) -> float:
    import boto3
    import torch

    import ckptio

    server, url = start_moto()
    try:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        state = make_state(8, args.s3_mib // 8, 0)
        nbytes = state_bytes(state)
        root = "s3://bench/ck"
        with ckptio.Checkpointer(root) as ck:
            ck.save(1, state).wait(timeout=600)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="bench", Prefix="ck/")["Contents"]
                if o["Key"].endswith(".distcp")]
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        sink = tempfile.mkdtemp(prefix="bench-restore-", dir="/dev/shm")
        s5cmd = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")

        def boto(rep: int) -> None:
            for key in keys:
                with open(os.path.join(sink, os.path.basename(key)), "wb") as f:
                    client.download_fileobj("bench", key, f)

        def s5(rep: int) -> None:
            subprocess.run([s5cmd, "--endpoint-url", url, "cp", *[f"s3://bench/{k}" for k in keys], sink + "/"],
                           check=True, capture_output=True)

        with ckptio.Checkpointer(root) as ck:
            runs = {"ckptio restore": lambda rep: ck.restore(target), "boto3 download_fileobj": boto}
            if os.path.exists(s5cmd):
                runs["s5cmd cp"] = s5
            times: dict[str, list[float]] = {k: [] for k in runs}
            for rep in range(args.reps + 1):
                for name, fn in runs.items():
                    t0 = time.perf_counter()
                    fn(rep)
                    if rep:
                        times[name].append(time.perf_counter() - t0)
        shutil.rmtree(sink, ignore_errors=True)
    finally:
        server.terminate()
        server.wait()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n[4] S3 (moto, own process), {nbytes / MiB:.0f} MiB in {len(keys)} data object(s)")
    for k, v in times.items():
        print(f"  {k:<24} {nbytes / med[k] / MiB:8.0f} MiB/s  {fmt_times(v)}")
    best = min(v for k, v in med.items() if k != "ckptio restore")
    ratio = best / med["ckptio restore"]
    print(f"  ckptio ÷ best client = {ratio:.2f} ({verdict(ratio, 1.0, at_most=False)})")
    return ratio


_MEMORY = """
import json, sys, torch, ckptio
state = {f"t{i}": torch.full((int(sys.argv[2]) // 16 // 4,), float(i)) for i in range(16)}
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field))
with ckptio.Checkpointer(sys.argv[1]) as ck:
    ck.save(1, state).wait(timeout=900)
    for t in state.values():
        t.zero_()
    before = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    ck.restore(state)
    peak = status("VmHWM:")
print(json.dumps({"extra": peak - before, "ok": all(bool((t == i).all()) for i, t in enumerate(state.values()))}))
"""


def memory(args: argparse.Namespace, base: Path) -> float:
    nbytes = args.mem_mib * MiB
    out = subprocess.run([sys.executable, "-c", _MEMORY, str(base / "mem"), str(nbytes)], capture_output=True,
                         text=True, check=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    extra = report["extra"] / MiB
    print(f"\n[5] memory: {args.mem_mib} MiB restore, peak RSS above the state {extra:.0f} MiB "
          f"(values ok {report['ok']}; {verdict(extra, 256, at_most=True)})")
    return extra


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--fio-bs", default="4M,16M", help="fio block sizes; the fastest is the anchor")
    p.add_argument("--ranks-mib", type=int, default=256)
    p.add_argument("--s3-mib", type=int, default=256)
    p.add_argument("--mem-mib", type=int, default=2048)
    p.add_argument("--dir", default=None, help="directory on the disk under test (default: the temp dir)")
    p.add_argument("--skip", default="", help="comma-separated: posix,ranks,s3,memory")
    args = p.parse_args()
    quiet_dcp()
    skip = set(filter(None, args.skip.split(",")))
    ratios: dict[str, float | str] = {}
    with scratch_dir(args.dir, "bench-restore-") as base:
        print(f"scratch {base} on {device_of(base)}")
        if "posix" not in skip:
            posix = posix_one_process(args, base)
            ratios["restore_vs_fio"], ratios["restore_vs_dcp_load"], ratios["restore_predicted_vs_measured"] = posix
        if "ranks" not in skip:
            found = multi_rank(args, base)
            ratios.update({k: v for k, v in found.items() if k != "reshard"})
            ratios["reshard_read_amplification"] = found["reshard"]
        if "s3" not in skip:
            ratios["s3_vs_best_client"] = s3(args)
        if "memory" not in skip:
            ratios["memory_extra_mib"] = memory(args, base)
    ratio_line(**ratios)


if __name__ == "__main__":
    main()
