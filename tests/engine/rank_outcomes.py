"""Run a function on real gloo ranks and collect what each rank reports, with a deadline instead of a hang.

Unlike :func:`ckptio.testing.ranks.run_ranks` (every rank must succeed, and they all meet at the end), a rank here
may fail, die or stay stuck: each rank's function returns a JSON-able report (or raises: the report then names the
exception), which the rank writes to ``out/rank<r>.json``. Then the rank stays alive, as a training process that
caught the error and went on would (its sockets open: a peer waiting for it is not released by its exit), until the
parent has every report it waits for, or ``deadline_s`` passes, and kills every rank. It returns the reports (None
for a rank that wrote none). The deadline is a hang detector far above what the scenario needs, not a timing claim.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ckptio.errors import CkptError
from ckptio.testing.fork_server import fork_context
from ckptio.testing.ranks import free_port, take_environment


def describe(exc: BaseException) -> dict[str, Any]:
    """What a test asserts about an exception: its class, message, and ckptio context."""
    out: dict[str, Any] = {"raised": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, CkptError):
        out.update(context={k: v for k, v in exc.context.items() if isinstance(v, (int, str))})
    return out


def _entry(rank: int, world: int, port: int, run: tuple[str, Callable[..., dict[str, Any]], tuple[Any, ...]],
           env: dict[str, str]) -> None:
    take_environment(env)
    out, fn, args = run
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t0 = time.monotonic()
    try:
        report = {"ok": True, **fn(rank, world, *args)}
    except BaseException as exc:
        report = {"ok": False, **describe(exc), "trace": traceback.format_exc()[-3000:]}
    report["seconds"] = time.monotonic() - t0
    path = os.path.join(out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)
    while True:  # no teardown (a peer may be dead or stuck, and meeting it would hang): the parent kills us
        time.sleep(1)


def run_outcomes(world: int, fn: Callable[..., dict[str, Any]], out: str, *args: Any, deadline_s: float = 180.0,
                 wait_for: Sequence[int] | None = None) -> list[dict[str, Any] | None]:
    """Each rank's report of ``fn(rank, world, *args)``. Waits for the reports of the ranks of ``wait_for`` (every
    rank when None), at most ``deadline_s`` (a rank that dies writes none), then kills every rank."""
    ctx = fork_context()
    port, env = free_port(), dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(r, world, port, (out, fn, args), env), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + deadline_s
    wanted = [os.path.join(out, f"rank{r}.json") for r in (range(world) if wait_for is None else wait_for)]
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in wanted):
        time.sleep(0.1)
    for p in procs:
        if p.is_alive() and p.pid is not None:
            os.kill(p.pid, signal.SIGKILL)
        p.join()
    reports: list[dict[str, Any] | None] = []
    for r in range(world):
        path = os.path.join(out, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                reports.append(json.load(f))
        else:
            reports.append(None)
    return reports
