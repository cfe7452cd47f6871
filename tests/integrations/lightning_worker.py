"""torchrun worker of test_lightning: every case with strategy="ddp" on every rank; each rank writes its results.

The process group is set up here, before Lightning's (which then reuses it), so that one Checkpointer per rank
serves every run: a Checkpointer per run would boot a writer process per run.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import ckptio
from tests.integrations.lightning_common import resume_runs

if __name__ == "__main__":
    root, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        # The epoch-based case runs on one process only (test_fit_resume_is_bit_exact_on_one_process): time.
        result = resume_runs(ck, out, world_size=dist.get_world_size(), cases=("mid_epoch", "epoch_end"))
    with ckptio.Checkpointer(root + "-last-batch", keep_last=0) as ck:  # it saves step 6 too: a root of its own
        result["last_batch"] = resume_runs(ck, out, world_size=dist.get_world_size(), cases=("last_batch",))[
            "last_batch"]
    if rank == 0:
        torch.save(result["stopped_params"], os.path.join(out, "stopped_params.pt"))
    del result["stopped_params"]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
