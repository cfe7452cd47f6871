"""One rank of a two-level training job for tests/engine/test_two_levels.py (a real process: kill -9 reaches it).

Usage: python two_level_job.py SPEC_JSON, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment.
SPEC: root, local (this node's local dir), node, steps (how many steps to train after the restore),
durable_every, replicas, mode: "exit" (close and exit), "hang" (wait to be killed), "unreachable" (stop the
partner's writer during one save), "sigterm" (train until SIGTERM; the checkpointer saves and exits).
Each rank's state at step s is a pure function of (s, rank), under a key of its own (no DCP de-duplication), so a
restore is checked bit-exactly. Prints one JSON line per event of interest.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import ckptio
from ckptio.errors import CkptError


def state_for(step: int, rank: int) -> dict:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {f"w{rank}": torch.randn(128, 1024, generator=g), f"b{rank}": torch.full((8,), float(step)), "step": step}


def blank(rank: int) -> dict:
    return {f"w{rank}": torch.zeros(128, 1024), f"b{rank}": torch.zeros(8), "step": -1}


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ck = ckptio.Checkpointer(spec["root"], local_dir=spec["local"], node_id=spec["node"],
                             durable_every=spec["durable_every"], replicas=spec.get("replicas", 1), lease_s=0,
                             keep_last=2, fsync=False, partner_timeout_s=spec.get("partner_timeout_s", 20.0),
                             commit_timeout_s=120, every_steps=1, preempt_grace_s=30.0, volume_check="off",
                             events_path=spec.get("events"))
    target = blank(rank)
    restored = ck.restore(target)
    ok = restored is None or all(torch.equal(v, state_for(restored, rank)[k]) if isinstance(v, torch.Tensor)
                                 else v == restored for k, v in target.items())
    say(rank=rank, restored=restored, ok=ok, last_restore=ck.last_restore)
    start = (restored or 0) + 1
    if spec["mode"] == "unreachable":
        unreachable(ck, rank, start)
    elif spec["mode"] == "sigterm":
        for step in range(start, start + 100_000):
            ck.maybe_save(step, state_for(step, rank))  # a SIGTERM makes this an emergency save + SystemExit(0)
            say(rank=rank, saved=step)
            time.sleep(0.05)
    else:
        for step in range(start, start + spec["steps"]):
            ck.save(step, state_for(step, rank)).wait()
        port = next(p[3] for p in ck._levels.start.peers if p[0] == rank) if ck._levels is not None else None
        say(rank=rank, done=start + spec["steps"] - 1, writer_pid=ck._writer.pid, partner_port=port)
    if spec["mode"] == "hang":
        dist.barrier()
        while True:
            time.sleep(1)
    ck.close()
    dist.destroy_process_group()


def unreachable(ck: ckptio.Checkpointer, rank: int, start: int) -> None:
    """Step start: both levels fine. Step start+1: rank 1's writer is stopped (SIGSTOP), so rank 0's copy to it
    times out. Step start+2: fine again."""
    ck.save(start, state_for(start, rank)).wait()
    if rank == 1:
        os.kill(ck._writer.pid, signal.SIGSTOP)
    dist.barrier()
    handle = ck.save(start + 1, state_for(start + 1, rank))
    if rank == 0:
        try:
            handle.wait()
        except CkptError as exc:
            say(rank=rank, failed=start + 1, error_type=type(exc).__name__, error=str(exc))
    dist.barrier()
    if rank == 1:
        os.kill(ck._writer.pid, signal.SIGCONT)
        try:
            handle.wait()
        except CkptError as exc:
            say(rank=rank, failed=start + 1, error_type=type(exc).__name__, error=str(exc))
    ck.save(start + 2, state_for(start + 2, rank)).wait()
    say(rank=rank, done=start + 2)


if __name__ == "__main__":
    main()
