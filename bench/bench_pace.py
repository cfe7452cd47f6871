"""Paced flushes against a data loader on the same disk: what each save mode costs the loader, and the training.

A loader process reads a large file on the filesystem of the durable root with ``O_DIRECT`` and 8 MiB reads in a
loop (as a data loader streaming its dataset does), sampling its throughput every 100 ms. Meanwhile a 2-rank gloo
job trains (a CPU matmul step) and saves ``--mib`` MiB per rank every ``--every`` steps, in rounds that interleave
the modes (order rotating per round): ``none`` (no save: the loader's and the step's baseline), DCP-best
(``ckptio.demo.dcp_best.DcpBest``), ckptio unpaced, and ckptio with ``flush_pace="auto"``.

Figures, per mode (medians over its saves):

* **loader loss**: the dip a save carves into the loader. Each save interval's loader throughput (100 ms samples
  from the save's start) is divided by its own calm tail, the median of the interval's last quarter, where no flush
  of any mode runs (a paced one ends by the fraction, half the interval); the median over the mode's saves at each
  100 ms is the mode's profile; the profile's worst 0.5 s window against ``none``'s: 1 − worst ÷ worst in ``none``.
  Why the tail: the VM's disk and CPU drift by tens of percent over minutes, between the segments the modes run
  in; each interval against its own tail cancels that drift, and the median over saves the loader's own dips,
  which fall anywhere. ``none``'s worst window (the floor left, printed) is the like-with-like reference.
  In brackets, each save's own worst window, their median, against ``none``'s: it keeps the depth of a burst whose
  start jitters from save to save, which the median profile smears, but also every dip of the loader's own (a
  floor of 0.10–0.20 here, the size of a paced flush's whole dip). ``--profile`` prints the profiles.
* **time lost per save**: the save call and the wait for staging, plus each step of the interval beyond the
  interval's calm tail (the median step of its last quarter), their sum; the median over the mode's saves. ``none``
  measured the same way prints as the check (its sum should be near zero).
* every save committed, none skipped; ckptio's blocking, so a pace never makes a save wait.
* the paced rate: the job's achieved rate (``flush_paced`` events, summed over ranks) against the planner's paced
  demand (the job's bytes over ``flush_pace_fraction`` of the measured interval); and the unpaced flush's rate
  (the job's bytes over the time from the first rank's serialization to the last upload): on a disk that serves
  reads and writes from one budget, the paced loss ÷ the unpaced one should be about the paced rate ÷ the
  unpaced one, which the bench prints beside the measured ratio.

The interval (``--every`` 250 steps, ~10 s here) is a few times the unpaced flush (~1 s): a pace can only lower the
loader's loss by as much as it lowers the rate: at 5 s the paced window (2.5 s at the default fraction) is only
2.5 times the unpaced flush, and on a disk that serves reads and writes from one budget paced ÷ unpaced is then
about 0.4, whatever the writer does. A real job's interval is minutes against a flush of seconds.

    .venv/bin/python bench/bench_pace.py [--mib 256] [--every 250] [--rounds 3] [--saves 4] [--fraction 0.5]
        [--dir DIR] [--profile]

Ends with ``RATIOS loader_loss_paced_vs_dcp_best=… loader_loss_paced_vs_unpaced=… lost_paced_vs_dcp_best=…
paced_rate_predicted_vs_measured=…`` (goals: ≤ 0.3, ≤ 0.3, ≤ 0.5, within 0.8–1.2).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import MiB, ratio_line, scratch_dir, verdict

MODES = ("none", "dcp_best", "ckptio", "ckptio_auto")
SAMPLE_S = 0.1
WINDOW_S = 0.5
READ = 8 * MiB


# ---- the loader (its own process) -------------------------------------------------------------------------------
def loader_main(path: str, out: str) -> None:
    """Read ``path`` with O_DIRECT in 8 MiB pieces, round and round, until SIGTERM; write (mono, bytes) samples."""
    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    size = os.fstat(fd).st_size
    buf = mmap.mmap(-1, READ)  # page-aligned, as O_DIRECT needs
    samples: list[tuple[float, int]] = []
    offset, got, tick = 0, 0, time.monotonic() + SAMPLE_S
    while not stop:
        n = os.preadv(fd, [buf], offset)
        got += n
        offset = offset + n if n and offset + n < size else 0
        now = time.monotonic()
        if now >= tick:
            samples.append((now, got))
            got, tick = 0, tick + SAMPLE_S
    os.close(fd)
    Path(out).write_text(json.dumps(samples))


def start_loader(directory: Path, gib: float) -> tuple[subprocess.Popen[bytes], Path]:
    data = directory / "dataset.bin"
    with open(data, "wb") as f:  # incompressible bytes, written once (not part of any measurement)
        for _ in range(int(gib * 1024 // 64)):
            f.write(os.urandom(64 * MiB))
        os.fsync(f.fileno())
    out = directory / "loader.json"
    proc = subprocess.Popen([sys.executable, __file__, "--loader", str(data), str(out)])
    return proc, out


# ---- the job (2 gloo ranks) -----------------------------------------------------------------------------------------
def rank_main(rank: int, world_size: int, spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter

    import ckptio
    from ckptio.demo.dcp_best import DcpBest

    torch.set_num_threads(1)
    root = Path(spec["dir"])
    state = {f"w{rank}": torch.randn(spec["mib"] * MiB // 4 // 4, 4)}  # a key per rank: no DCP de-duplication
    a = torch.randn(spec["width"], spec["width"])
    options = {"lease_s": 0, "volume_check": "off", "events_path": str(root / "events" / "ev.jsonl")}
    savers: dict[str, Any] = {
        "ckptio": ckptio.Checkpointer(str(root / "ckptio"), **options | {"events_path": str(root / "ev-u.jsonl")}),
        "ckptio_auto": ckptio.Checkpointer(str(root / "ckptio_auto"), flush_pace="auto",
                                           flush_pace_fraction=spec["fraction"],
                                           **options | {"events_path": str(root / "ev-p.jsonl")}),
        "dcp_best": DcpBest(process_group=dist.new_group(backend="gloo")),
    }
    for ck in (savers["ckptio"], savers["ckptio_auto"]):
        ck.writer_ready(120)
    records: list[dict[str, Any]] = []
    handles: list[tuple[str, Any]] = []
    step, segment = 0, 0

    def train(n: int, mode: str, save_at: int | None) -> None:
        """One save interval of ``n`` steps (the save, if any, at step ``save_at``)."""
        nonlocal step
        for i in range(n):
            step += 1
            t0 = time.monotonic()
            waited = 0.0
            if i == save_at:
                waited = save(mode)
            a.mul_(0.999).add_(a @ a * 1e-6)  # the step: a matmul on one thread
            dist.all_reduce(a[0, :8])  # lockstep, as data-parallel training is
            records.append({"mode": mode, "step": step, "t": t0, "s": time.monotonic() - t0, "save": i == save_at,
                            "waited": waited, "start": i == 0, "segment": segment})

    def save(mode: str) -> float:
        t0 = time.monotonic()
        if mode == "dcp_best":
            savers[mode].save(state, FileSystemWriter(str(root / "dcp_best" / f"step-{step}")))
            savers[mode].wait_staged()
        else:
            handle = savers[mode].save(step, state)
            savers[mode].wait_staged()
            handles.append((mode, handle))
        return time.monotonic() - t0

    train(spec["every"], "none", None)  # warm-up: first saves plan, allocate slots, boot checkpoint processes
    for mode in MODES[1:]:
        train(spec["every"], mode, 0)
    for r in range(spec["rounds"]):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            # The previous segment's writeback (DCP writes through the page cache) ends before this one begins, and
            # its intervals end with its last step: no mode is charged another's disk traffic.
            os.sync()
            dist.barrier()
            segment += 1
            for _ in range(spec["saves"]):
                train(spec["every"], mode, None if mode == "none" else 0)
    savers["dcp_best"].close()
    for mode in ("ckptio", "ckptio_auto"):
        savers[mode].close()
    for mode, handle in handles:  # every save's own outcome: committed, skipped or failed
        records.append({"mode": mode, "handle_step": handle.step, "blocking": handle.blocking_s,
                        "skipped": handle.skipped, "committed": handle.done() and handle.error is None
                        and not handle.skipped, "interval": handle.interval_s})
    Path(root / f"rank{rank}.json").write_text(json.dumps({"records": records}))


# ---- analysis -------------------------------------------------------------------------------------------------------
def windows(records: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per mode, each save interval of the measured segments (the warm-up, segment 0, apart): from its first step
    (the one that saves) to the next interval's first step, or the segment's last step's end."""
    out: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    steps = [r for r in records if "t" in r and r["segment"] > 0]
    for i, r in enumerate(steps):
        if not r["start"]:
            continue
        j = i + 1
        while j < len(steps) and steps[j]["segment"] == r["segment"] and not steps[j]["start"]:
            j += 1
        same = j < len(steps) and steps[j]["segment"] == r["segment"]
        out[r["mode"]].append((r["t"], steps[j]["t"] if same else steps[j - 1]["t"] + steps[j - 1]["s"]))
    return out


TAIL = 0.25
"""The last quarter of an interval: its calm tail, where no flush of any mode runs."""


def _calm(values: list[float]) -> float:
    """The median of the last :data:`TAIL` of ``values``."""
    return statistics.median(values[-max(1, round(len(values) * TAIL)):])


def _aligned(samples: list[tuple[float, int]], spans_of: list[tuple[float, float]]) -> list[list[float]]:
    """The loader's rate in each sample period after the start of each span, one row per span, each divided by its
    calm tail."""
    rows = [[n / SAMPLE_S for t, n in samples if a <= t < b] for a, b in spans_of]
    calm = [_calm(row) if row else 0.0 for row in rows]
    return [[r / c for r in row] for row, c in zip(rows, calm, strict=True) if c > 0]


def _median_profile(rows: list[list[float]]) -> list[float]:
    """The median over the rows at each sample period (as long as the shortest row)."""
    return [statistics.median(row[i] for row in rows) for i in range(min(map(len, rows), default=0))]


def _worst_window(rates: list[float], k: int) -> float | None:
    return min(statistics.fmean(rates[i:i + k]) for i in range(len(rates) - k + 1)) if len(rates) >= k else None


def loader_figures(samples: list[tuple[float, int]], spans: dict[str, list[tuple[float, float]]],
                   ) -> dict[str, Any]:
    """Per mode, the dip its saves carve into the loader (the module docstring's measures): ``loss`` (the worst
    window of the tail-relative median ``profile``, against ``none``'s), ``per_save`` (each save's own worst
    window, their median, against ``none``'s), ``floor`` (1 − ``none``'s worst profile window: the noise left)."""
    k = round(WINDOW_S / SAMPLE_S)
    rows = {mode: _aligned(samples, spans[mode]) for mode in MODES}
    profiles = {mode: _median_profile(rows[mode]) for mode in MODES}
    worst = {mode: float("nan") if (w := _worst_window(profile, k)) is None else w
             for mode, profile in profiles.items()}
    per_save = {mode: statistics.median(w for w in (_worst_window(row, k) for row in rows[mode]) if w is not None)
                for mode in MODES}
    alone = statistics.median(n / SAMPLE_S for t, n in samples if any(a <= t < b for a, b in spans["none"]))
    return {"alone_Bps": alone, "profile": profiles, "floor": 1.0 - worst["none"],
            "loss": {mode: max(0.0, 1.0 - worst[mode] / worst["none"]) for mode in MODES},
            "per_save": {mode: max(0.0, 1.0 - per_save[mode] / per_save["none"]) for mode in MODES}}


def step_figures(records: list[dict[str, Any]], spans: dict[str, list[tuple[float, float]]],
                 ) -> dict[str, dict[str, Any]]:
    """Per mode, from each save interval's steps against the interval's calm tail (its median step; the VM's speed
    drifts over minutes: a clean step measured elsewhere charged a save with that drift, either way), in ms per
    0.5 s from the save's start: ``lost`` (their sum, the median over the mode's saves) and ``profile`` (the median
    over the saves at each 0.5 s: where the time lost lands)."""
    steps = [r for r in records if "t" in r and r["segment"] > 0]
    out: dict[str, dict[str, Any]] = {"lost": {}, "profile": {}}
    for mode in MODES:
        rows = []
        for a, b in spans[mode]:
            inside = [r for r in steps if a <= r["t"] < b]
            calm = _calm([r["s"] for r in inside])
            row = [0.0] * (int((b - a) / WINDOW_S) + 1)
            for r in inside:
                row[int((r["t"] - a) / WINDOW_S)] += (r["s"] - calm) * 1000
            rows.append(row)
        out["lost"][mode] = statistics.median(map(sum, rows))
        out["profile"][mode] = _median_profile(rows)
    return out


def _events(directory: Path, name: str, ranks: int, event: str) -> list[dict[str, Any]]:
    from ckptio.obs.events import rank_path

    lines = [line for rank in range(ranks) for line in Path(rank_path(str(directory / name), rank)).read_text()
             .splitlines()]
    return [r for r in map(json.loads, lines) if r["event"] == event]


def paced_flushes(directory: Path, ranks: int, steady: set[int]) -> tuple[list[float], list[float]]:
    """Per paced save in ``steady`` (steps saved one interval after the previous paced save, as in a job that saves
    periodically: a mode's first save after the others' turn measured a whole round), the job's achieved rate (the
    sum over ranks of each rank's ``flush_paced`` rate) and the longest rank's paced flush in seconds."""
    rate: dict[int, float] = {}
    seconds: dict[int, float] = {}
    for r in _events(directory, "ev-p.jsonl", ranks, "flush_paced"):
        if r.get("tier") == "durable" and not r.get("hurried") and r["step"] in steady:
            rate[r["step"]] = rate.get(r["step"], 0.0) + float(r["achieved_bytes_per_s"])
            seconds[r["step"]] = max(seconds.get(r["step"], 0.0), float(r["seconds"]))
    return list(rate.values()), list(seconds.values())


def unpaced_rates(directory: Path, ranks: int) -> list[float]:
    """Per unpaced save, the job's bytes over the time from the first rank's serialization to the last upload."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for r in _events(directory, "ev-u.jsonl", ranks, "phase"):
        steps.setdefault(r["step"], []).append(r)
    rates = []
    for phases in steps.values():
        uploads = [p for p in phases if p["phase"] == "upload"]
        began = min((p["mono"] - p["seconds"] for p in phases if p["phase"] == "serialize"), default=None)
        if uploads and began is not None:
            rates.append(sum(p["bytes"] for p in uploads) / (max(p["mono"] for p in uploads) - began))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB saved per rank")
    parser.add_argument("--every", type=int, default=250, help="steps between saves (~10 s)")
    parser.add_argument("--width", type=int, default=1024, help="the step's matmul size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--saves", type=int, default=4, help="saves per mode per round")
    parser.add_argument("--loader-gib", type=float, default=1.0)
    parser.add_argument("--fraction", type=float, default=0.5, help="flush_pace_fraction of the paced mode")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--profile", action="store_true",
                        help="print each mode's loader profile (of the calm tail) per 0.5 s")
    parser.add_argument("--loader", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loader:
        loader_main(*args.loader)
        return
    from ckptio.plan.costs.pace import paced_demand
    from ckptio.testing.ranks import run_ranks

    ranks = 2
    with scratch_dir(args.dir, "ckptio-bench-pace-") as directory:
        loader, out = start_loader(directory, args.loader_gib)
        try:
            spec = {"dir": str(directory), "mib": args.mib, "every": args.every, "width": args.width,
                    "rounds": args.rounds, "saves": args.saves, "fraction": args.fraction}
            run_ranks(ranks, rank_main, spec)
        finally:
            loader.send_signal(signal.SIGTERM)
            loader.wait(60)
        samples = json.loads(out.read_text())
        per_rank = [json.loads((directory / f"rank{r}.json").read_text()) for r in range(ranks)]
        records = per_rank[0]["records"]
        spans = windows(records)
        figures = loader_figures(samples, spans)
        loss = figures["loss"]
        by_steps = step_figures(records, spans)
        lost = by_steps["lost"]
        saves = [r for p in per_rank for r in p["records"] if "handle_step" in r]
        interval = statistics.median(b - a for a, b in spans["ckptio_auto"])
        steady = {r["handle_step"] for r in saves if r["mode"] == "ckptio_auto" and r["interval"]
                  and r["interval"] < 1.5 * interval}
        achieved, paced_s = paced_flushes(directory, ranks, steady)
        unpaced = unpaced_rates(directory, ranks)
        predicted = paced_demand(ranks * args.mib * MiB, interval_s=interval, fraction=args.fraction)
        committed = {m: sum(r["committed"] for r in saves if r["mode"] == m) for m in ("ckptio", "ckptio_auto")}
    per_save = figures["per_save"]
    print(f"loader alone {figures['alone_Bps'] / MiB:.0f} MiB/s; save interval {interval:.2f} s; "
          f"{args.mib} MiB per rank x {ranks} ranks")
    print(f"loader loss: the worst 0.5 s of the tail-relative profile against none's (headline; none's own floor "
          f"{figures['floor']:.2f}); each save's own worst window against none's in brackets. Time lost per save: "
          f"none's own {lost['none']:.0f} ms")
    for mode in MODES[1:]:
        print(f"  {mode:12s} loader loss {loss[mode]:.2f} [{per_save[mode]:.2f}]   "
              f"time lost per save {lost[mode]:.0f} ms")
    k = round(WINDOW_S / SAMPLE_S)
    for mode, rates in figures["profile"].items() if args.profile else ():
        halves = [statistics.fmean(rates[i:i + k]) for i in range(0, len(rates) - k + 1, k)]
        print(f"  {mode:12s} loader per 0.5 s, of its tail: " + " ".join(f"{r:.2f}" for r in halves))
    for mode, lost_ms in by_steps["profile"].items() if args.profile else ():
        print(f"  {mode:12s} steps' time beyond the tail's per 0.5 s, ms: " + " ".join(f"{v:.0f}" for v in lost_ms))
    blocking = {m: [s["blocking"] or 0.0 for s in saves if s["mode"] == m and s["interval"]]  # the first plans
                for m in ("ckptio", "ckptio_auto")}
    print(f"ckptio saves (both ranks): {len(saves)}, skipped {sum(s['skipped'] for s in saves)}, committed per mode "
          f"{committed}, blocking after the first save, median / max: "
          + ", ".join(f"{m} {statistics.median(b) * 1000:.1f} / {max(b) * 1000:.1f} ms" for m, b in blocking.items()))
    paced_rate, unpaced_rate = statistics.median(achieved), statistics.median(unpaced)
    print(f"paced rate: achieved {paced_rate / MiB:.0f} MiB/s (median of {len(achieved)} saves), "
          f"planner {predicted / MiB:.0f} MiB/s; unpaced flush {unpaced_rate / MiB:.0f} MiB/s: a disk that serves "
          f"reads and writes from one budget gives paced / unpaced loss ~ {paced_rate / unpaced_rate:.2f}; the paced "
          f"flush ends at {statistics.median(paced_s) / interval:.2f} of the interval (the calm tail from "
          f"{1 - TAIL:.2f})")
    ratios = {
        "loader_loss_paced_vs_dcp_best": loss["ckptio_auto"] / loss["dcp_best"] if loss["dcp_best"] else float("nan"),
        "loader_loss_paced_vs_unpaced": loss["ckptio_auto"] / loss["ckptio"] if loss["ckptio"] else float("nan"),
        "lost_paced_vs_dcp_best": lost["ckptio_auto"] / lost["dcp_best"] if lost["dcp_best"] > 0 else float("nan"),
        "paced_rate_predicted_vs_measured": predicted / paced_rate,
    }
    print(verdict(ratios["loader_loss_paced_vs_dcp_best"], 0.3, at_most=True), "(loader, paced vs DCP-best)")
    ratio_line(**ratios)


if __name__ == "__main__":
    main()
