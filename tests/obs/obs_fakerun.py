"""A small event-level simulation of a training run with checkpoints, written through the real ``EventLog``.

Used until (and besides) the engine's end-to-end run: it produces the event files a real 2-rank run writes —
steps, saves agreed and skipped on all ranks alike, staging, writer phases, commits — with timings chosen by
the test, so the report's numbers can be checked against values the test knows exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from ckptio.obs.events import EventLog, rank_path

WALL0 = 1_700_000_000.0


@dataclass(kw_only=True)
class FakeRun:
    ranks: int = 2
    steps: int = 100
    every: int = 20
    step_s: float = 0.2
    contention: float = 1.3
    """Step time multiplier while a flush runs on that rank."""
    stage_s: float = 0.05
    flush_s: float = 1.5
    flush_growth_s: float = 0.0
    """Each save's flush is this much longer than the previous one (a store falling behind)."""
    rank_slowdown: float = 0.2
    """Rank r's flush takes (1 + r × this) × flush_s."""
    nbytes: int = 64 << 20
    noise: float = 0.0
    hiccup_every: int = 0
    hiccup_x: float = 1.0
    """Every hiccup_every-th step takes hiccup_x times as long, flush or not (a collector pass, a noisy
    neighbour): step times that skew right, as real ones do."""
    seed: int = 0
    fail_step: int | None = None
    clock_skew: dict[int, float] = field(default_factory=dict)
    """Per-rank offset of the monotonic clock (ranks on different hosts)."""


def _rec(rank: int, role: str, event: str, t: float, step: int | None, *, skew: float, **fields: Any) -> dict:
    return {
        "ts": WALL0 + t,
        "mono": 1000.0 + t + skew,
        "rank": rank,
        "role": role,
        "event": event,
        "step": step,
        **fields,
    }


def simulate(run: FakeRun) -> dict[int, list[dict]]:
    """Events per rank, in time order. Ranks step in lockstep (a collective per step gates on the slowest)."""
    rng = random.Random(run.seed)
    out: dict[int, list[dict]] = {r: [] for r in range(run.ranks)}
    busy_until = [0.0] * run.ranks  # end of the rank's current flush
    last_request: float | None = None
    t = 0.0
    flush_index = 0
    for step in range(1, run.steps + 1):
        durs = [
            run.step_s * (run.contention if t < busy_until[r] else 1.0) * (1 + rng.uniform(0, run.noise))
            for r in range(run.ranks)
        ]
        saving = step % run.every == 0
        stage_t = run.stage_s if saving else 0.0
        hiccup = run.hiccup_x if run.hiccup_every and step % run.hiccup_every == 0 else 1.0
        length = max(durs) * hiccup + stage_t  # lockstep: every rank waits for the slowest
        for r in range(run.ranks):
            sk = run.clock_skew.get(r, 0.0)
            out[r].append(_rec(r, "trainer", "step_begin", t, step, skew=sk))
        if saving:
            req = t + max(durs)
            skip = any(busy_until[r] > req for r in range(run.ranks))
            interval = None if last_request is None else req - last_request
            last_request = req
            for r in range(run.ranks):
                _save(
                    out[r],
                    run=run,
                    r=r,
                    step=step,
                    req=req,
                    skip=skip,
                    interval=interval,
                    flush_index=flush_index,
                    busy_until=busy_until,
                )
            if not skip:
                flush_index += 1
        for r in range(run.ranks):
            sk = run.clock_skew.get(r, 0.0)
            out[r].append(_rec(r, "trainer", "step_end", t + length, step, skew=sk, seconds=length))
        t += length
    return out


def _save(
    ev: list[dict],
    *,
    run: FakeRun,
    r: int,
    step: int,
    req: float,
    skip: bool,
    interval: float | None,
    flush_index: int,
    busy_until: list[float],
) -> None:
    sk = run.clock_skew.get(r, 0.0)
    ev.append(_rec(r, "trainer", "save_requested", req, step, skew=sk))
    if skip:
        ev.append(
            _rec(r, "trainer", "save_skipped", req + 0.001, step, skew=sk, reason="no free slot", pending=1)
        )
        return
    ev.append(_rec(r, "trainer", "save_agreed", req + 0.001, step, skew=sk, blocked_s=0.0, pending=0))
    ev.append(_rec(r, "trainer", "stage_begin", req + 0.002, step, skew=sk))
    ret = req + run.stage_s
    ev.append(
        _rec(
            r,
            "trainer",
            "stage_end",
            ret - 0.001,
            step,
            skew=sk,
            bytes=run.nbytes,
            seconds=run.stage_s - 0.003,
        )
    )
    ev.append(
        _rec(r, "trainer", "save_returned", ret, step, skew=sk, blocking_s=run.stage_s, bytes=run.nbytes)
    )
    ev.append(_rec(r, "writer", "queue", ret + 0.001, None, skew=sk, pending=1))
    total = (run.flush_s + flush_index * run.flush_growth_s) * (1 + r * run.rank_slowdown)
    parts = [
        ("serialize", 0.15, "local"),
        ("local_write", 0.25, "local"),
        ("upload", 0.55, "durable"),
        ("rank_index", 0.05, "durable"),
    ]
    t = ret
    for name, share, tier in parts:
        seconds = total * share
        t += seconds
        nbytes = run.nbytes if name in ("serialize", "local_write", "upload") else 300
        ev.append(
            _rec(r, "writer", "phase", t, step, skew=sk, phase=name, seconds=seconds, bytes=nbytes, tier=tier)
        )
    if run.fail_step == step:
        ev.append(
            _rec(
                r, "writer", "save_failed", t, step, skew=sk, error="disk on fire", error_type="StorageError"
            )
        )
    else:
        ev.append(
            _rec(
                r,
                "writer",
                "committed",
                t,
                step,
                skew=sk,
                flush_s=t - ret,
                bytes=run.nbytes,
                lag_s=t - req,
                interval_s=interval,
            )
        )
    ev.append(_rec(r, "writer", "queue", t + 0.001, None, skew=sk, pending=0))
    busy_until[r] = t


def write_run(run: FakeRun, path: str) -> list[str]:
    """Write the run's events with EventLog (one file per rank); returns the files."""
    files = []
    for rank, records in simulate(run).items():
        log = EventLog(rank_path(path, rank), rank=rank, role="trainer")
        for record in records:
            log.record(record)
        log.close()
        files.append(rank_path(path, rank))
    return files
