"""A training job for the signal tests: one save in flight through a slow store, then idle until signalled.

Prints ``saved <trainer pid> <writer pid>`` once ``save`` returned. ``sigterm`` mode uses the Checkpointer without a
``with`` block (a SIGTERM skips it anyway); ``sigint`` mode wraps the loop in ``with`` as a training script does, so
Ctrl-C unwinds through ``close()``.
Usage: python signal_job.py ROOT sigterm|sigint
"""

from __future__ import annotations

import os
import sys
import time

import torch

import ckptio
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import ThrottledStorage


def main() -> None:
    root, mode = sys.argv[1], sys.argv[2]
    slow = ThrottledStorage(PosixStorage(root), write_bytes_per_s=4 << 20)
    state = {"w": torch.full((2048, 1024), 7.0)}  # 8 MiB: two seconds through the store
    ck = ckptio.Checkpointer(slow, commit_timeout_s=60.0)
    assert ck.writer_ready(timeout=120)
    if mode == "sigint":
        with ck:
            _save_and_idle(ck, state)
    _save_and_idle(ck, state)


def _save_and_idle(ck: ckptio.Checkpointer, state: dict) -> None:
    # Staging is asynchronous: once staged, the save is the writer's ("in flight"); before that it does not exist.
    ck.save(1, state).wait_staged()
    print(f"saved {os.getpid()} {ck._writer.pid}", flush=True)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
