"""One rank of a training job inside the cluster lab (tests/lab): run on a lab node by ``Lab.launch_ranks``.

Usage: python lab_job.py SPEC_JSON, with the torchrun variables, ``CKPTIO_PARTNER_HOST`` and ``CKPTIO_LAB_NODE``
set by the lab. SPEC: root (the parallel filesystem's mount of this node, or an s3:// URL), local (this node's
local dir, or null), steps (saves after the restore), durable_every, replicas, lease_s, mode: "exit" (save, close,
exit), "hang" (save, then wait to be killed: a node loss).

Each rank's state at step s is a pure function of (s, rank), under keys of its own, so a restore is checked
bit-exactly. Prints one JSON line per event of interest: {"restored": step, "ok": bool, "last_restore": {...}},
{"done": last saved step}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import ckptio


def state_for(step: int, rank: int) -> dict:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {f"w{rank}": torch.randn(64, 1024, generator=g), f"b{rank}": torch.full((8,), float(step)), "step": step}


def blank(rank: int) -> dict:
    return {f"w{rank}": torch.zeros(64, 1024), f"b{rank}": torch.zeros(8), "step": -1}


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    options = {"local_dir": spec["local"], "durable_every": spec.get("durable_every", 1),
               "replicas": spec.get("replicas", 1)} if spec.get("local") else {}
    ck = ckptio.Checkpointer(spec["root"], node_id=os.environ["CKPTIO_LAB_NODE"], keep_last=2, fsync=False,
                             every_steps=1, lease_s=spec.get("lease_s", 0), volume_check="off",
                             partner_timeout_s=30.0, commit_timeout_s=120, **options)
    target = blank(rank)
    restored = ck.restore(target)
    expected = state_for(restored or 0, rank)
    ok = restored is None or all(torch.equal(v, expected[k]) if isinstance(v, torch.Tensor) else v == restored
                                 for k, v in target.items())
    say(rank=rank, restored=restored, ok=ok, last_restore=dataclasses.asdict(ck.last_restore))
    start = (restored or 0) + 1
    for step in range(start, start + spec["steps"]):
        ck.save(step, state_for(step, rank)).wait()
    say(rank=rank, done=start + spec["steps"] - 1)
    if spec["mode"] == "hang":
        dist.barrier()
        while True:  # the node is lost (SIGKILL) while training goes on
            time.sleep(1)
    ck.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
