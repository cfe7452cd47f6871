"""torchrun worker of test_hf: the three runs on every rank; each rank writes what the test compares."""

from __future__ import annotations

import json
import os
import sys

import torch

from tests.integrations.hf_common import three_runs

if __name__ == "__main__":
    root, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    result = three_runs(root, out, world_size=int(os.environ["WORLD_SIZE"]))
    rank = int(os.environ["RANK"])
    if rank == 0:
        torch.save(result["stopped_params"], os.path.join(out, "stopped_params.pt"))
    del result["stopped_params"]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
