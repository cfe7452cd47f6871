"""Writer start-up: seconds from process start to its ``writer_started`` event, and its RSS, rank 0 and rank ≠ 0.

Each rep starts a real writer process through ``WriterProxy`` (the trainer's own path), waits for its
``writer_started`` event, reads its RSS (psutil) and whether it mapped libtorch (``/proc/PID/maps``), then stops it.
Rank ≠ 0 then runs one real save job (a plan and a staged slot from this process) and its RSS and libtorch are read
again after its rank index is written: serialization must not pull torch in. The anchors, measured in the same run:
a bare interpreter (``python -c pass``: boot and RSS) and ``python -c "import torch"`` (what a writer that imports
torch pays at least).

    .venv/bin/python bench/bench_writer_boot.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

from _common import MiB, ratio_line


def _torch_mapped(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any("libtorch" in line for line in f)


def _anchor(code: str) -> tuple[float, float]:
    """Boot seconds and RSS MiB of ``python -c code`` (RSS read while it sleeps after the code ran)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    boot = time.perf_counter() - t0
    proc = subprocess.Popen([sys.executable, "-c", code + "\nimport sys, time\nsys.stdout.write('r\\n')\n"
                             "sys.stdout.flush()\ntime.sleep(30)"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    rss = psutil.Process(proc.pid).memory_info().rss / MiB
    proc.kill()
    proc.wait()
    return boot, rss


def _start(rank: int, root: str) -> tuple[Any, Any, dict[str, Any]]:
    from ckptio.config import CheckpointerConfig
    from ckptio.engine.protocol import WriterEvent, WriterStart
    from ckptio.engine.trainer.writer_proxy import WriterProxy
    from ckptio.storage import open_storage

    cfg = CheckpointerConfig(root=root, commit_timeout_s=1.0, writer_nice=0)
    start = WriterStart(config=cfg.writer_config(), rank=rank, world_size=2, durable=open_storage(root),
                        local=None, owner=None)
    seen: dict[str, Any] = {"events": [], "ready": threading.Event()}

    def on_message(msg: Any) -> None:
        if isinstance(msg, WriterEvent):
            seen["events"].append(msg.record)
            if msg.record.get("event") == "writer_started":
                seen["t_ready"] = time.perf_counter()
                seen["ready"].set()

    proxy = WriterProxy(start, on_message=on_message, on_death=lambda code: None)
    seen["t0"] = time.perf_counter()
    proxy.start()
    return proxy, start, seen


def _one_job(proxy: Any, root: str, seen: dict[str, Any]) -> None:
    """A small real save on rank 1: plan + slot staged here, the writer serializes and writes its rank index."""
    import torch
    from torch.distributed.checkpoint.planner import WriteItem

    from ckptio.engine.protocol import SaveJob, WriterPlan
    from ckptio.engine.trainer.rank_plan import make_planner
    from ckptio.engine.trainer.staging_area import StagingArea, copy_into_slot
    from ckptio.format.layout import plan_layout

    state = {f"w{i}": torch.randn(256, 256) for i in range(8)} | {"b": torch.randn(7).bfloat16()}
    items: list[WriteItem] = make_planner(state, is_coordinator=False).create_local_plan().items
    layout = plan_layout(1, items, 1 << 30)
    area = StagingArea(1)
    slot = area.acquire(0, layout)
    copy_into_slot(slot, [state[t.fqn] for t in layout.tensors])
    proxy.send_plan(WriterPlan(1, layout, metadata_skeleton=None))
    proxy.submit(SaveJob(step=1, save_id=7, slot_id=0, slot_path=slot.path, slot_nbytes=slot.nbytes, plan_id=1,
                         objects=()))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(root, "step-00000001", "ranks", "1.json")):
        if time.monotonic() > deadline:
            raise TimeoutError("the writer wrote no rank index")
        time.sleep(0.02)
    area.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    bare = [_anchor("pass") for _ in range(args.reps)]
    torch_anchor = [_anchor("import torch") for _ in range(args.reps)]
    rows: dict[str, list[tuple[float, float, bool]]] = {"rank0": [], "rank1": [], "rank1_after_job": []}
    for _ in range(args.reps):
        for rank in (0, 1):
            with tempfile.TemporaryDirectory() as root:
                proxy, _start_msg, seen = _start(rank, root)
                if not seen["ready"].wait(120):
                    raise TimeoutError("writer did not start")
                pid = proxy.pid
                rss = psutil.Process(pid).memory_info().rss / MiB
                rows[f"rank{rank}"].append((seen["t_ready"] - seen["t0"], rss, _torch_mapped(pid)))
                if rank == 1:
                    _one_job(proxy, root, seen)
                    rows["rank1_after_job"].append((0.0, psutil.Process(pid).memory_info().rss / MiB,
                                                    _torch_mapped(pid)))
                proxy.stop()
    med = {k: (statistics.median(b for b, _, _ in v), statistics.median(r for _, r, _ in v), any(t for *_, t in v))
           for k, v in rows.items()}
    bare_boot, bare_rss = statistics.median(b for b, _ in bare), statistics.median(r for _, r in bare)
    t_boot, t_rss = statistics.median(b for b, _ in torch_anchor), statistics.median(r for _, r in torch_anchor)
    print(f"python -c pass        boot {bare_boot:6.3f} s  RSS {bare_rss:7.1f} MiB")
    print(f"python -c import torch boot {t_boot:6.3f} s  RSS {t_rss:7.1f} MiB")
    for name, (boot, rss, torch_in) in med.items():
        print(f"writer {name:16s} boot {boot:6.3f} s  RSS {rss:7.1f} MiB  libtorch mapped: {torch_in}")
    ratio_line(
        rank0_boot_vs_bare=med["rank0"][0] / bare_boot,
        rank1_boot_vs_bare=med["rank1"][0] / bare_boot,
        rank1_boot_vs_import_torch=med["rank1"][0] / t_boot,
        rank0_rss_vs_bare=med["rank0"][1] / bare_rss,
        rank1_rss_vs_bare=med["rank1"][1] / bare_rss,
        rank1_job_rss_vs_bare=med["rank1_after_job"][1] / bare_rss,
        rank1_torch_free=int(not med["rank1"][2] and not med["rank1_after_job"][2]),
    )


if __name__ == "__main__":
    main()
