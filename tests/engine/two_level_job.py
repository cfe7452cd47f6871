"""One rank of a two-level training job for tests/engine/test_two_levels.py (a real process: kill -9 reaches it).

Usage: python two_level_job.py SPEC_JSON, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment
(set by the test, or by ``torchrun``). SPEC: root, local (this node's local dir), node (both default to
``local_base``-n<RANK> and n<RANK>: one "node" per rank, for a launcher that gives every rank the same SPEC),
steps (how many steps to train after the restore), durable_every, replicas, restore_step (restore this step, not
the newest), variant (of the state saved: the same step saved twice holds different values), expect_variant (of
the state restored), mode:
"exit" (close and exit), "hang" (wait to be killed), "twice" (save each step twice: variant 0, then 1),
"mismatch" (restore into a state with an extra key), "unreachable" (stop the partner's writer during saves),
"sigterm" (train with maybe_save until SIGTERM; prints the step it exited at), "sigterm-save" (the same, calling
save), "sigterm-idle" (one save, then no save call until killed), "blocked-restore" / "blocked-save" (one save;
then rank 1 stops itself with SIGSTOP and rank 0 calls restore, or a save of a new structure, which waits in a
gloo collective for it), "stage-fails" (one save, then a local-level save whose staging copy fails on rank 1:
every rank says how its save ended and how long that took).
``window`` sets ``preempt_duplicate_window_s``.
Each rank's state at step s is a pure function of (s, rank, variant), under a key of its own (no DCP
de-duplication), so a restore is checked bit-exactly. Prints one JSON line per event of interest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

import ckptio
from ckptio.errors import CkptError


def state_for(step: int, rank: int, variant: int = 0) -> dict:
    g = torch.Generator().manual_seed(1000 * step + rank + 1_000_000 * variant)
    return {f"w{rank}": torch.randn(128, 1024, generator=g), f"b{rank}": torch.full((8,), float(step)), "step": step}


def blank(rank: int) -> dict:
    return {f"w{rank}": torch.zeros(128, 1024), f"b{rank}": torch.zeros(8), "step": -1}


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")  # one write: ranks sharing a pipe (torchrun, python -u) never mix
    sys.stdout.flush()


def watch_partner_checks() -> list[list[str]]:
    """Record every check of a partner copy this rank's restore makes: [file, the thread that made it]."""
    from ckptio.engine.restore.levels_storage_reader import LevelsStorageReader

    checks: list[list[str]] = []
    check, check_pushed = LevelsStorageReader._partner_copy_intact, LevelsStorageReader._pushed_copy_intact

    def recorded(self: LevelsStorageReader, key: str, name: str) -> bool:
        checks.append([name, threading.current_thread().name])
        return check(self, key, name)

    def recorded_pushed(self: LevelsStorageReader, name: str, landed: Any) -> bool:  # a copy pushed to this rank
        checks.append([name, threading.current_thread().name])
        return check_pushed(self, name, landed)

    LevelsStorageReader._partner_copy_intact = recorded  # type: ignore[method-assign]
    LevelsStorageReader._pushed_copy_intact = recorded_pushed  # type: ignore[method-assign]
    return checks


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    node = spec.get("node") or f"n{rank}"
    local = spec.get("local") or f"{spec['local_base']}-{node}"
    ck = ckptio.Checkpointer(spec["root"], local_dir=local, node_id=node,
                             durable_every=spec["durable_every"], replicas=spec.get("replicas", 1), lease_s=0,
                             keep_last=2, fsync=False, partner_timeout_s=spec.get("partner_timeout_s", 20.0),
                             commit_timeout_s=spec.get("commit_timeout_s", 120), every_steps=1,
                             preempt_grace_s=spec.get("grace", 30.0), volume_check="off",
                             events_path=spec.get("events"),
                             max_pending=4 if spec["mode"] == "unreachable" and rank == 1 else 1,
                             **({"preempt_duplicate_window_s": spec["window"]} if "window" in spec else {}))
    if spec["mode"].startswith("blocked"):
        blocked(ck, rank, spec["mode"])
        return
    if spec["mode"] == "mismatch":
        target = {**blank(rank), "extra": torch.zeros(3)}
        try:
            ck.restore(target)
        except CkptError as exc:
            say(rank=rank, restore_error=type(exc).__name__, error=str(exc))
        ck.close()
        return
    target = blank(rank)
    checks = watch_partner_checks()
    restored = ck.restore(target, step=spec.get("restore_step"))
    expected = state_for(restored or 0, rank, spec.get("expect_variant", 0))
    ok = restored is None or all(torch.equal(v, expected[k]) if isinstance(v, torch.Tensor) else v == restored
                                 for k, v in target.items())
    say(rank=rank, restored=restored, ok=ok, last_restore=dataclasses.asdict(ck.last_restore), pid=os.getpid(),
        partner_checks=checks)
    start = (restored or 0) + 1
    if spec["mode"] == "unreachable":
        unreachable(ck, rank, start, stopped_s=spec["partner_timeout_s"] + 2.0)
    elif spec["mode"].startswith("sigterm"):
        until_sigterm(ck, rank, start, spec["mode"])
    elif spec["mode"] == "stage-fails":
        stage_fails(ck, rank, start)
    else:
        for step in range(start, start + spec["steps"]):
            ck.save(step, state_for(step, rank, spec.get("variant", 0))).wait()
            if spec["mode"] == "twice":
                ck.save(step, state_for(step, rank, 1)).wait()
        levels = ck.levels.writer_start()
        port = next(p.port for p in levels.peers if p.rank == rank) if levels is not None else None
        say(rank=rank, done=start + spec["steps"] - 1, writer_pid=ck._writer.pid, partner_port=port)
    if spec["mode"] == "hang":
        dist.barrier()
        while True:
            time.sleep(1)
    ck.close()
    dist.destroy_process_group()


def until_sigterm(ck: ckptio.Checkpointer, rank: int, start: int, mode: str) -> None:
    """Train until a SIGTERM makes the checkpointer save and exit (SystemExit(0)), or, idle, until it kills us."""
    if mode == "sigterm-idle":
        ck.save(start, state_for(start, rank)).wait()
        say(rank=rank, saved=start)
        while True:  # evaluation, data preparation: no save call
            time.sleep(0.05)
    for step in range(start, start + 100_000):
        try:
            if mode == "sigterm":
                ck.maybe_save(step, state_for(step, rank))  # a SIGTERM makes this an emergency save + SystemExit(0)
            else:
                ck.save(step, state_for(step, rank))
        except SystemExit as exc:
            say(rank=rank, exited=exc.code, at_step=step)
            raise
        say(rank=rank, saved=step)
        time.sleep(0.05)


def stage_fails(ck: ckptio.Checkpointer, rank: int, start: int) -> None:
    """Step start commits; at step start+1 rank 1's staging copy raises (every rank's save there is local-level
    only), and each rank says how its save ended and after how long."""
    ck.save(start, state_for(start, rank)).wait()
    dist.barrier()
    if rank == 1:
        def broken_copy(*args: object, **kwargs: object) -> None:
            raise RuntimeError("injected: the staging copy failed")

        torch._foreach_copy_ = broken_copy  # type: ignore[assignment]  # this process's copies only
    t0 = time.monotonic()
    try:
        ck.save(start + 1, state_for(start + 1, rank)).wait()
        say(rank=rank, outcome="committed", seconds=time.monotonic() - t0)
    except CkptError as exc:
        say(rank=rank, outcome=type(exc).__name__, error=str(exc), seconds=time.monotonic() - t0)


def blocked(ck: ckptio.Checkpointer, rank: int, mode: str) -> None:
    """Rank 0 waits in native code (a gloo collective) for rank 1, which is stopped: only SIGTERM ends rank 0."""
    ck.save(1, state_for(1, rank)).wait()
    dist.barrier()
    if rank == 1:
        say(rank=rank, stopping=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    say(rank=rank, waiting=mode)
    if mode == "blocked-restore":
        ck.restore(blank(rank))
    else:  # a new structure: the planning save's barrier waits for every rank
        ck.save(2, {**state_for(2, rank), "extra": torch.zeros(4)})
    say(rank=rank, unblocked=True)  # never, while rank 1 is stopped


def unreachable(ck: ckptio.Checkpointer, rank: int, start: int, *, stopped_s: float) -> None:
    """Step start: fine. Steps start+1..start+3: rank 1's writer is stopped (SIGSTOP) for ``stopped_s``, so rank
    0's copies to it time out; rank 1 stages into spare slots meanwhile (max_pending=4). Then rank 1's writer goes
    on, every save commits, and training goes on."""
    ck.save(start, state_for(start, rank)).wait()
    if rank == 1:
        os.kill(ck._writer.pid, signal.SIGSTOP)
    dist.barrier()
    handles = [ck.save(step, state_for(step, rank)) for step in range(start + 1, start + 4)]
    say(rank=rank, returned=start + 3)
    dist.barrier()
    if rank == 1:
        time.sleep(stopped_s)
        os.kill(ck._writer.pid, signal.SIGCONT)
    for handle in handles:
        handle.wait()
    ck.save(start + 4, state_for(start + 4, rank)).wait()
    say(rank=rank, done=start + 4)


if __name__ == "__main__":
    main()
