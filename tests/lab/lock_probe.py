"""Take a lock on the lab's parallel filesystem, from one node (tests/lab/test_lab_jobs.py).

Usage: python lock_probe.py KIND PATH MODE. KIND: ``flock-dir`` (``flock`` on a directory: what ckptio's POSIX
compare-and-swap serializes with today) or ``lockf-file`` (a POSIX record lock on a regular file). MODE: ``hold``
(take it, blocking, print {"held": true}, and keep it until the process is killed) or ``try`` (try
once without blocking, print {"acquired": bool}).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time


def lock(kind: str, path: str, blocking: bool) -> tuple[int, bool]:
    if kind == "flock-dir":
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        take = fcntl.flock
    else:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        take = fcntl.lockf
    try:
        take(fd, flags)
    except BlockingIOError:
        return fd, False
    return fd, True


def main() -> None:
    kind, path, mode = sys.argv[1:4]
    _fd, got = lock(kind, path, blocking=mode == "hold")
    if mode == "hold":
        print(json.dumps({"held": got}), flush=True)
        while True:  # hold until the test kills us
            time.sleep(1)
    else:
        print(json.dumps({"acquired": got}), flush=True)


if __name__ == "__main__":
    main()
