"""torchrun worker of test_hf: resume a checkpoint written at another world size; each rank writes the outcome."""

from __future__ import annotations

import json
import os
import sys

import torch

from tests.integrations.hf_common import STOP_AT, trainer

if __name__ == "__main__":
    root, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    job = trainer(root, out, save=False, world_size=int(os.environ["WORLD_SIZE"]))
    try:
        job.train(resume_from_checkpoint=STOP_AT)
        outcome = {"error": None, "global_step": job.state.global_step}
    except Exception as exc:  # the outcome is what the test checks
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(outcome, f)
