"""POSIX flush throughput of ckptio vs ``fio --rw=write --bs=16M --end_fsync=1`` in the same directory.

ckptio's figure is bytes ÷ (commit time − ``save`` return): the background part of a save (serialize, checksum,
write, fsync, rank index, metadata, manifest, retention), one rank, one writer process. The anchor is one fio job
writing the same number of bytes into the same directory with a final fsync, parsed from fio's JSON output. Reps
alternate fio and ckptio so that load from other processes on this shared machine hits both alike; each rep starts
from an empty directory. Median of ``--reps`` after one warm-up of each.

    .venv/bin/python bench/bench_flush_posix.py [--mib 1024] [--reps 3] [--dir /tmp]

Goal (bench/README.md): ckptio ≥ 0.9 × fio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import (
    MiB,
    device_of,
    drop_written,
    fio_write,
    make_state,
    phase_summary,
    ratio_line,
    read_events,
    scratch_dir,
    state_bytes,
    verdict,
)


def flush_once(ck: object, step: int, state: dict) -> float:
    """Seconds from ``save`` returning to the commit being seen by this rank."""
    handle = ck.save(step, state)  # type: ignore[attr-defined]
    t_return = time.monotonic()
    handle.wait()
    return time.monotonic() - t_return


def writer_without_zip_crc() -> None:
    """Diagnosis without touching the engine: the writer inherits this process's sys.path as PYTHONPATH, so a
    ``sitecustomize`` placed first on it runs in the writer at startup and turns torch.save's zip crc32 off."""
    import tempfile

    hook = tempfile.mkdtemp(prefix="ckptio-bench-hook-")
    with open(os.path.join(hook, "sitecustomize.py"), "w") as fh:
        fh.write("import torch.serialization\ntorch.serialization.set_crc32_options(False)\n")
    sys.path.insert(0, hook)


def manifest_rates(recs: list[dict], nbytes: int, steps: range) -> list[float]:
    """MiB/s from ``save`` returning to the manifest being written (the commit itself), from the events: what
    ``handle.wait()`` adds after it (``latest``, retention) is left out."""
    rates = []
    for step in steps:
        returned = [e["mono"] for e in recs if e["step"] == step and e["event"] == "save_returned"]
        manifest = [e["mono"] for e in recs if e["step"] == step and e["event"] == "phase"
                    and e.get("phase") == "manifest"]
        if returned and manifest:
            rates.append(nbytes / (manifest[0] - returned[0]) / MiB)
    return rates


def writer_costs(reps: int = 9) -> None:
    """Diagnosis: per-32 MiB CPU cost of what the writer does per tensor, variants interleaved so load hits all."""
    import io
    import mmap

    import crc32c
    import torch

    torch.set_num_threads(1)  # as the writer runs
    n = 32 * MiB
    slot = mmap.mmap(-1, n)
    raw = torch.frombuffer(slot, dtype=torch.uint8)
    raw.copy_(torch.randint(0, 255, (n,), dtype=torch.uint8))
    tensor = raw.view(torch.float32)

    def serialize(crc: bool) -> bytes:
        torch.serialization.set_crc32_options(crc)
        try:
            out = io.BytesIO()
            torch.save(tensor, out)
            return out.getvalue()
        finally:
            torch.serialization.set_crc32_options(True)

    blob = serialize(True)
    import tempfile

    with tempfile.TemporaryFile() as sink:

        def write_page_cache() -> None:
            sink.seek(0)
            sink.write(memoryview(slot))

        variants = {
            "torch.save -> BytesIO -> getvalue (as the writer does)": lambda: serialize(True),
            "the same with torch's zip crc32 off": lambda: serialize(False),
            "crc32c of the serialized blob (ckptio's checksum)": lambda: crc32c.crc32c(blob),
            "crc32c straight over the slot (a zero-copy path)": lambda: crc32c.crc32c(memoryview(slot)),
            "memcpy into fresh memory (what BytesIO growth costs)": lambda: torch.empty_like(tensor).copy_(tensor),
            "write of the slot into the page cache (no fsync)": write_page_cache,
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(reps):
            for name, fn in variants.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<56} {med * 1e3:7.1f} ms  {32 / med:7.0f} MiB/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="state size in MiB (32 MiB fp32 tensors)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="parent directory on the disk under test (default: /tmp)")
    parser.add_argument("--file-mib", type=int, default=1024, help="ckptio file_size_bytes in MiB")
    parser.add_argument("--no-fsync", action="store_true", help="ckptio fsync=False (diagnosis only)")
    parser.add_argument("--writer-no-zip-crc", action="store_true",
                        help="diagnosis: the writer's torch.save skips the zip records' crc32 (ckptio has crc32c)")
    parser.add_argument("--writer-costs", action="store_true",
                        help="diagnosis: print the writer's per-byte CPU costs for one 32 MiB tensor and exit")
    args = parser.parse_args()
    if args.writer_costs:
        writer_costs()
        return 0

    import ckptio

    if args.writer_no_zip_crc:
        writer_without_zip_crc()
    state = make_state(max(1, args.mib // 32), 32, 0)
    nbytes = state_bytes(state)
    with scratch_dir(args.dir, "ckptio-bench-flush-") as base:
        fio_dir, ck_root = base / "fio", base / "ckptio"
        fio_dir.mkdir()
        events = str(base / "events.jsonl")
        print(f"{nbytes / MiB:.0f} MiB per flush into {base} ({device_of(base)}); reps {args.reps} + 1 warm-up")
        ck = ckptio.Checkpointer(str(ck_root), max_pending=1, keep_last=1, events_path=events,
                                 file_size_bytes=args.file_mib * MiB, fsync=not args.no_fsync)
        fio_rates, ck_rates = [], []
        try:
            for rep in range(-1, args.reps):
                drop_written(fio_dir)
                fio_rate = fio_write(fio_dir, nbytes)
                drop_written(fio_dir)
                ck_rate = nbytes / flush_once(ck, rep + 1, state) / MiB
                print(f"  rep {rep:>2}{' (warm-up)' if rep < 0 else ''}: fio {fio_rate:7.1f} MiB/s   "
                      f"ckptio {ck_rate:7.1f} MiB/s", flush=True)
                if rep >= 0:
                    fio_rates.append(fio_rate)
                    ck_rates.append(ck_rate)
        finally:
            ck.close()
        recs = read_events(events)
        print(f"  ckptio phases of the last step (writer, summed over files): {phase_summary(recs, args.reps)}")
        to_manifest = manifest_rates(recs, nbytes, range(1, args.reps + 1))

    fio_med, ck_med = statistics.median(fio_rates), statistics.median(ck_rates)
    ratio = ck_med / fio_med
    print(f"fio write+fsync {fio_med:.1f} MiB/s; ckptio flush {ck_med:.1f} MiB/s; "
          f"ratio {ratio:.2f} ({verdict(ratio, 0.9, at_most=False)})")
    commit_ratio = statistics.median(to_manifest) / fio_med if to_manifest else float("nan")
    print(f"  (to the manifest being written, i.e. without what follows the commit: "
          f"{statistics.median(to_manifest) if to_manifest else float('nan'):.1f} MiB/s, ratio {commit_ratio:.2f})")
    ratio_line(flush_vs_fio=ratio, to_manifest_vs_fio=commit_ratio, ckptio_mibs=f"{ck_med:.1f}",
               fio_mibs=f"{fio_med:.1f}", mib=f"{nbytes // MiB}", writers=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
