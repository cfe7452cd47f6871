"""A one-rank job for tests/engine/test_supersede_crash.py: save step 1, then save it again.

Usage: python supersede_job.py BASE LEVEL (the root is BASE/root, the local dir BASE/local). LEVEL ``durable``
saves every step durably; ``local`` makes every save a local-level save (``durable_every`` large, no partner).
Saves step 1 (variant A) and waits, prints ``saved A``, then saves step 1 again (variant B): the test kills the
job at a point of that supersede.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import ckptio


def state_for(variant: str) -> dict:
    g = torch.Generator().manual_seed(ord(variant))
    return {"w": torch.randn(256, 1024, generator=g), "step": 1}


def job_options(base: Path, level: str) -> dict:
    """The job's options for a root under ``base`` (``root``, ``local``)."""
    options = {"keep_last": 2, "lease_s": 0, "fsync": False, "volume_check": "off", "commit_timeout_s": 60}
    if level == "local":
        options.update(local_dir=str(base / "local"), durable_every=1000, replicas=0)
    return options


def main() -> None:
    base, level = Path(sys.argv[1]), sys.argv[2]
    ck = ckptio.Checkpointer(str(base / "root"), **job_options(base, level))
    ck.save(1, state_for("A")).wait(timeout=120)
    print("saved A", flush=True)
    ck.save(1, state_for("B")).wait(timeout=120)  # the test kills the job at a point of this supersede
    print("saved B", flush=True)
    ck.close()


if __name__ == "__main__":
    main()
