"""A training job for the crash tests: restore, then save every step until killed.

The state at step ``s`` is a pure function of ``s``, so a restored checkpoint can be checked bit-exactly.
Prints ``restored <step> <ok>`` once, then ``saved <step>`` after each save() returns.
Usage: python crash_job.py ROOT [LOCAL_DIR]
"""

from __future__ import annotations

import sys

import torch

import ckptio


def state_for(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "w": torch.randn(512, 1024, generator=g),  # 2 MiB
        "small": [torch.full((16,), float(step)) for _ in range(50)],
        "step": step,
    }


def blank() -> dict:
    return {"w": torch.zeros(512, 1024), "small": [torch.zeros(16) for _ in range(50)], "step": -1}


def main() -> None:
    root = sys.argv[1]
    local = sys.argv[2] if len(sys.argv) > 2 else None
    ck = ckptio.Checkpointer(root, local_dir=local, keep_last=2, max_pending=2, overflow="block")
    target = blank()
    restored = ck.restore(target)
    if restored is None:
        print("restored none 1", flush=True)
        start = 1
    else:
        expected = state_for(restored)
        ok = target["step"] == restored and torch.equal(target["w"], expected["w"]) and all(
            torch.equal(a, b) for a, b in zip(target["small"], expected["small"], strict=True)
        )
        print(f"restored {restored} {int(ok)}", flush=True)
        start = restored + 1
    for step in range(start, start + 10_000):
        ck.save(step, state_for(step))
        print(f"saved {step}", flush=True)


if __name__ == "__main__":
    main()
