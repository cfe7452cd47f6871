"""``python -m ckptio.plan.io_load PATH NBYTES NICE``: the planner's stand-in for ckptio's writer process, driven by
:func:`ckptio.plan.host.measure_direct_io_collateral`.

A process of its own at the writer's priority and I/O class (:func:`ckptio._proc.lower_priority`), as ckptio's
writer is: a thread of the training process would share its interpreter lock and its process's scheduling, which
the writer never does. It prepares ``NBYTES`` (one random :data:`~ckptio.storage.direct_io.CHUNK` repeated: the
device is what is measured, not the bytes), prints ``ready``, waits for a line on stdin, writes them into a new
file ``PATH`` with ckptio's own ``O_DIRECT`` path and fsyncs it, prints one JSON line — ``cpu_s`` (its CPU time
for the write), ``unsupported`` (the filesystem refuses ``O_DIRECT``) and ``error`` (any other failure, or null)
— and exits 0. The caller removes the file. Imports the standard library and ckptio's ``O_DIRECT`` path only: it
is ready in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ckptio._proc import lower_priority
from ckptio.storage.direct_io import CHUNK, DirectIOUnsupported, write_direct


def _parts(nbytes: int) -> list[memoryview]:
    block = memoryview(os.urandom(min(nbytes, CHUNK)))
    whole, rest = divmod(nbytes, block.nbytes)
    return [block] * whole + ([block[:rest]] if rest else [])


def main(argv: list[str]) -> int:
    path, nbytes, nice = argv[0], int(argv[1]), int(argv[2])
    lower_priority(nice)
    parts = _parts(nbytes)
    print("ready", flush=True)
    sys.stdin.readline()
    outcome: dict[str, object] = {"unsupported": False, "error": None}
    began = time.process_time()
    try:
        write_direct(path, parts, fsync=True)
    except DirectIOUnsupported:
        outcome["unsupported"] = True
    except OSError as exc:
        outcome["error"] = str(exc)
    outcome["cpu_s"] = time.process_time() - began
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
