"""A one-rank job for tests/engine/test_supersede_crash.py: save step 1, then save it again, or restore.

Usage: python supersede_job.py ROOT LOCAL_DIR LEVEL MODE. LEVEL ``durable`` saves every step durably;
``local`` makes every save a local-level save (``durable_every`` large, no partner). MODE ``save``: save step 1
(variant A) and wait, print ``saved A``, then save step 1 again (variant B) and wait (the test kills the job at a
point of that supersede). MODE ``restore``: restore the newest step and print ``restored <step> <variant>``
(``A``, ``B`` or ``neither``) and the level it came from.
"""

from __future__ import annotations

import json
import sys

import torch

import ckptio


def state_for(variant: str) -> dict:
    g = torch.Generator().manual_seed(ord(variant))
    return {"w": torch.randn(256, 1024, generator=g), "step": 1}


def main() -> None:
    root, local, level, mode = sys.argv[1:5]
    options = {"local_dir": local, "durable_every": 1000, "replicas": 0} if level == "local" else {}
    ck = ckptio.Checkpointer(root, keep_last=2, lease_s=0, fsync=False, volume_check="off", commit_timeout_s=60,
                             **options)
    if mode == "save":
        ck.save(1, state_for("A")).wait(timeout=120)
        print("saved A", flush=True)
        ck.save(1, state_for("B")).wait(timeout=120)
        print("saved B", flush=True)
    else:
        target = {"w": torch.zeros(256, 1024), "step": -1}
        step = ck.restore(target)
        variant = next((v for v in "AB" if torch.equal(target["w"], state_for(v)["w"])), "neither")
        print(json.dumps({"restored": step, "variant": variant, "level": ck.last_restore.level}), flush=True)
    ck.close()


if __name__ == "__main__":
    main()
