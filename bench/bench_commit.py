"""The commit path at scale (issue 20): constant metadata per commit, commits that keep up, kill -9 at that rate.

1. Metadata per commit at 1, 10 and 100 retained steps (``keep_last`` = N, so each commit retires one) and with 1,
   10 and 100 leftovers of attempts that never committed (above every saved step: in flight, as far as cleanup can
   tell). Counted two ways:
   - the storage operations of one save and its commit, by kind (``ckptio.testing.wrappers.OpCountingStorage``
     around the root, the writer's objects driven in this process), beside ``ckptio.format.commit_ops``'s count
     from the job's shape alone;
   - the file-metadata system calls of a real writer process (``strace -f -c`` on every thread of it: the stat
     family, open, getdents, unlink, rename, mkdir, link, fsync) per save, over ``--strace-saves`` saves.
2. Keeping up: one rank saves ``--mib`` MiB as fast as it can for ``--seconds`` (``keep_last=2``, ``max_pending=1``,
   ``overflow="block"``). A sampler counts the steps written on the root but not committed (max); after each save
   returns, the commit lag is the newest returned step − the newest committed one (p50, max).
3. kill -9 at that rate: ``--kills`` times, a job restores the newest step (bit-exact against the state its step
   defines, never older than the previous restore), then saves as fast as it can until it is killed -9 (trainer
   and writer) at a random moment after its first commit.

4. The first save at scale: the coordinator's planning of a 16,384-rank save (``bench_plan_scale.py``'s measure:
   unpickle every rank's plan, plan, pickle each answer), after a warm-up at 64 ranks.

Closing line: ``RATIOS metadata_100_vs_1=… uncommitted_max=… commit_lag_max_steps=… plan_16k_s=…`` (metadata: the
largest ratio of the wrapper's and strace's counts at 100 steps or leftovers over 1). Goals: metadata_100_vs_1 ≤ 1.1,
uncommitted_max ≤ max_pending + 1 = 2, every kill restores a committed step, plan_16k_s ≤ 2.

    .venv/bin/python bench/bench_commit.py [--mib 32] [--seconds 60] [--kills 20] [--strace-saves 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch

from _common import ratio_line, scratch_dir, verdict
from bench_plan_scale import measure as measure_plan
from ckptio import Checkpointer
from ckptio.config import CheckpointerConfig
from ckptio.engine.protocol import Outbox, SaveDone, SaveJob, WriterPlan, WriterStart
from ckptio.engine.trainer.rank_plan import global_plan, make_planner, split_items
from ckptio.engine.writer.pipeline import Writer
from ckptio.format import step_dir
from ckptio.format.commit_ops import CommitShape, commit_ops
from ckptio.format.layout import plan_layout
from ckptio.storage import open_storage
from ckptio.testing.wrappers import OpCountingStorage

SIZES = (1, 10, 100)
SYSCALLS = "%file,getdents64,fsync,fdatasync"
JOB = r"""
import json, sys, time, torch, ckptio
root, mib = sys.argv[1], int(sys.argv[2])
def state_for(step):
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(mib << 18, generator=g), "step": step}
ck = ckptio.Checkpointer(root, keep_last=2, lease_s=0, fsync=False, volume_check="off")
target = {"w": torch.zeros(mib << 18), "step": -1}
restored = ck.restore(target)
ok = restored is None or torch.equal(target["w"], state_for(restored)["w"])
print(json.dumps({"restored": restored, "ok": ok}), flush=True)
step = (restored or 0) + 1
handles, said = [], False
while True:
    handles.append(ck.save(step, state_for(step)))
    if not said and any(h.done() and h.error is None for h in handles):
        print(json.dumps({"committed": True}), flush=True)
        said = True
    handles = [h for h in handles if not h.done()]
    step += 1
"""


class _Pipe:
    """What Outbox sends on: every message kept in memory (the writer's objects run in this process)."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.cond = threading.Condition()

    def send(self, msg: Any) -> None:
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def wait_done(self, save_id: int) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: any(isinstance(m, SaveDone) and m.save_id == save_id
                                                for m in self.messages), 300)
        if not ok:
            raise RuntimeError(f"save {save_id} did not commit: {self.messages[-5:]}")


def _plan(state: dict[str, torch.Tensor]) -> WriterPlan:
    import pickle

    planner = make_planner(state, is_coordinator=True)
    (final,), metadata = global_plan(planner, [planner.create_local_plan()])
    tensors, objects = split_items(planner.finish_plan(final).items)
    skeleton = pickle.dumps(type(metadata)(state_dict_metadata=metadata.state_dict_metadata,
                                           planner_data=metadata.planner_data))
    return WriterPlan(1, plan_layout(0, tensors + objects, 64 << 20), skeleton)


def _job(plan: WriterPlan, state: dict[str, torch.Tensor], slot: Path, step: int) -> SaveJob:
    buf = bytearray(plan.layout.slot_bytes)
    for entry in plan.layout.tensors:
        buf[entry.slot_offset : entry.slot_offset + entry.nbytes] = state[entry.fqn].view(torch.uint8).numpy().tobytes()
    slot.write_bytes(bytes(buf))
    return SaveJob(step=step, save_id=step, slot_id=0, slot_path=str(slot), slot_nbytes=len(buf), plan_id=1,
                   objects=())


def _prefill(root: Path, retained: int, leftovers: int, state: dict[str, torch.Tensor]) -> None:
    """``retained`` committed steps (real saves) and ``leftovers`` uncommitted attempts above them."""
    with Checkpointer(str(root), keep_last=0, lease_s=0, fsync=False, volume_check="off") as ck:
        for step in range(1, retained + 1):
            ck.save(step, state)
    for i in range(leftovers):
        d = root / step_dir(1_000_000 + i)
        (d / "ranks").mkdir(parents=True)
        (d / "__0_0-0000000000001.distcp").write_bytes(b"x" * 4096)
        (d / "ranks" / "0.json").write_text("{}")


def wrapper_ops(scratch: Path, retained: int, leftovers: int, state: dict[str, torch.Tensor]) -> dict[str, int]:
    """One save's and commit's operations on the root, by kind, after a warm-up save."""
    root = scratch / f"wrap-{retained}-{leftovers}"
    root.mkdir()
    _prefill(root, retained, leftovers, state)
    counting = OpCountingStorage(open_storage(str(root), fsync=False))
    config = CheckpointerConfig(root=counting, keep_last=retained + 1, lease_s=0, volume_check="off")
    pipe = _Pipe()
    start = WriterStart(config=config.writer_config(), rank=0, world_size=1, durable=counting, local=None,
                        owner=None)
    writer = Writer(start, Outbox(pipe, 0))  # type: ignore[arg-type]
    plan = _plan(state)
    writer.add_plan(plan)
    try:
        for step in (5000, 5001):
            if step == 5001:
                before = counting.snapshot()
            writer.live.add(step)  # as the writer process does when a SaveJob arrives
            writer.run_job(_job(plan, state, scratch / "slot", step))
            pipe.wait_done(step)
            while writer.durable.committer.unfinished():
                time.sleep(0.01)
        after = counting.snapshot()
    finally:
        writer.close()
        shutil.rmtree(root, ignore_errors=True)
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def strace_calls(scratch: Path, retained: int, leftovers: int, state: dict[str, torch.Tensor],
                 saves: int) -> tuple[float, dict[str, int]]:
    """File-metadata system calls of the writer process per save (and the totals by call)."""
    root = scratch / f"strace-{retained}-{leftovers}"
    root.mkdir()
    _prefill(root, retained, leftovers, state)
    out = scratch / "strace.txt"
    with Checkpointer(str(root), keep_last=retained + 1, lease_s=0, fsync=False, volume_check="off") as ck:
        ck.save(5000, state).wait(timeout=300)  # warm-up: the writer's start, its sweep, its threads
        pid = ck._writer.pid
        tids = [f"-p{t}" for t in os.listdir(f"/proc/{pid}/task")]
        tracer = subprocess.Popen(["strace", "-f", "-c", "-o", str(out), "-e", f"trace={SYSCALLS}", *tids],
                                  stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached
        for step in range(5001, 5001 + saves):
            ck.save(step, state).wait(timeout=300)
        time.sleep(0.5)  # the last commit's cleanup
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=60)
    shutil.rmtree(root, ignore_errors=True)
    calls = _strace_counts(out.read_text())
    return sum(calls.values()) / saves, calls


def _strace_counts(text: str) -> dict[str, int]:
    counts = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and re.fullmatch(r"[\d.]+", fields[0]) and fields[-1] != "total":
            counts[fields[-1]] = int(fields[3])
    return counts


def keeping_up(scratch: Path, mib: int, seconds: float) -> dict[str, float]:
    root = scratch / "keep-up"
    root.mkdir()
    worst, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            dirs = [d for d in root.glob("step-*") if d.is_dir()]
            committed = [int(d.name[5:]) for d in dirs if (d / "manifest.json").exists()]
            newest = max(committed, default=0)
            worst[0] = max(worst[0], sum(1 for d in dirs if int(d.name[5:]) > newest and any(d.glob("*.distcp"))))
            stop.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    state = {"w": torch.randn(mib << 18)}
    lags, handles, newest_committed, step = [], [], 0, 0
    with Checkpointer(str(root), keep_last=2, max_pending=1, lease_s=0, fsync=False, volume_check="off") as ck:
        ck.save(0, state).wait(timeout=300)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            step += 1
            state["w"][0] = float(step)
            handles.append(ck.save(step, state))
            for h in handles:
                if h.done() and h.error is None and not h.skipped:
                    newest_committed = max(newest_committed, h.step)
            handles = [h for h in handles if not h.done()]
            lags.append(step - newest_committed)
    stop.set()
    sampler.join()
    return {"saves": step, "uncommitted_max": worst[0], "lag_p50": statistics.median(lags), "lag_max": max(lags)}


def kills(scratch: Path, mib: int, n: int, rng: random.Random) -> list[dict[str, Any]]:
    root = scratch / "kills"
    job = scratch / "kill_job.py"
    job.write_text(JOB)
    trials, previous = [], 0
    for trial in range(n + 1):  # the last launch only restores what the last kill left
        proc = subprocess.Popen([sys.executable, str(job), str(root), str(mib)], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        trials.append({**first, "monotonic": (first["restored"] or 0) >= previous})
        previous = first["restored"] or 0
        if trial < n:
            line = proc.stdout.readline()  # its first commit
            if not line:
                raise RuntimeError(f"the job exited ({proc.wait()}) before committing")
            time.sleep(rng.uniform(0.0, 2.0))
        os.killpg(proc.pid, signal.SIGKILL)  # trainer and writer together
        proc.wait()
        proc.stdout.close()
    return trials[1:]  # the first launch found an empty root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--strace-saves", type=int, default=5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    small = {"a": torch.randn(1 << 18), "b": torch.randn(1 << 16)}
    expected = commit_ops(CommitShape(world_size=1, files_per_rank=1, keep_last=2))
    print(f"commit_ops (world 1, 1 file, keep_last > 0): per save {expected.per_save}, per commit "
          f"{expected.per_commit}")
    ratios = []
    with scratch_dir(args.dir, "ckptio-bench-commit-") as scratch:
        for kind, shapes in (("retained", [(n, 0) for n in SIZES]), ("leftovers", [(1, n) for n in SIZES])):
            wrapped = {shape: wrapper_ops(scratch, *shape, small) for shape in shapes}
            traced = {shape: strace_calls(scratch, *shape, small, args.strace_saves) for shape in shapes}
            for shape in shapes:
                n = shape[0] if kind == "retained" else shape[1]
                print(f"{kind:>9} {n:>3}: wrapper {sum(wrapped[shape].values()):>3} ops {wrapped[shape]}  "
                      f"strace {traced[shape][0]:7.1f} calls/save {traced[shape][1]}")
            lo, hi = shapes[0], shapes[-1]
            ratios += [sum(wrapped[hi].values()) / sum(wrapped[lo].values()), traced[hi][0] / traced[lo][0]]
        up = keeping_up(scratch, args.mib, args.seconds)
        print(f"keeping up: {up['saves']} saves of {args.mib} MiB in {args.seconds:.0f} s, written but uncommitted "
              f"max {up['uncommitted_max']}, commit lag p50 {up['lag_p50']} max {up['lag_max']} steps")
        trials = kills(scratch, args.mib, args.kills, random.Random(20))
    found = sum(1 for t in trials if t["restored"] is not None)
    exact = all(t["ok"] for t in trials)
    monotonic = all(t["monotonic"] for t in trials)
    print(f"kill -9: {len(trials)} kills, {found} restored a committed step, bit-exact {exact}, monotonic "
          f"{monotonic}; restored steps {[t['restored'] for t in trials]}")
    measure_plan(64, 8, 4)  # warm-up: first-call costs are not the coordinator's
    plan = measure_plan(16_384, 8, 4)
    print(f"first save at 16,384 ranks: coordinator {plan['seconds']:.2f} s ({plan['cpu']:.2f} s CPU), DCP's "
          f"{plan['dcp_seconds']:.2f} s in the same run")
    metadata = max(ratios)
    print(f"metadata_100_vs_1 {verdict(metadata, 1.1, at_most=True)}, uncommitted_max "
          f"{verdict(float(up['uncommitted_max']), 2.0, at_most=True)}")
    ratio_line(metadata_100_vs_1=metadata, uncommitted_max=float(up["uncommitted_max"]),
               commit_lag_p50_steps=float(up["lag_p50"]), commit_lag_max_steps=float(up["lag_max"]),
               kills_restored=f"{found}/{len(trials)}", kills_exact_monotonic=str(exact and monotonic).lower(),
               plan_16k_s=plan["seconds"])


if __name__ == "__main__":
    main()
