"""The CPU a run's saves take outside the training processes: each rank's writer (every descendant of the rank
process) and each node's filesystem client (``mfsmount``, a FUSE daemon in user space), sampled from ``/proc``.

Why the lab measures it: on this machine every rank, writer, FUSE client and loader shares two cores, so a byte a
save moves costs training CPU twice over, once in the writer and once in the client that carries it to the store.
The planner's background model charges the writer's own CPU (``background_cpu_s``) and nothing for the client; the
cluster demo prints both beside it (:func:`save_cpu`).

It only reads ``/proc``: the processes are the lab's (:class:`~ckptio.testing.cluster.Proc`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (a rank's writer process and whatever it started)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                out.append(child)
                todo.append(child)
    return out


@dataclass
class CpuSampler:
    """Samples, every ``period_s``, the CPU so far of the writers under ``ranks`` (rank process ids) and of the
    ``clients`` (FUSE daemons' ids): ``samples`` is ``(wall time, writers' CPU, clients' CPU)``. A writer seen once
    keeps counting at its last reading after it exits, so a run's total never goes down."""

    ranks: list[int]
    clients: list[int]
    period_s: float = 0.25
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    _seen: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> CpuSampler:
        self._thread = threading.Thread(target=self._run, name="lab-cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for pid in (child for rank in self.ranks for child in descendants(rank)):
                self._seen[pid] = max(self._seen.get(pid, 0.0), cpu_seconds(pid))
            self.samples.append((time.time(), sum(self._seen.values()),
                                 sum(cpu_seconds(pid) for pid in self.clients)))


@dataclass(frozen=True, slots=True)
class SaveCpu:
    """CPU seconds per save, per node, outside the training processes."""

    writer_s: float
    """The node's writers over the saving phase ÷ saves (they idle in the calm phase)."""
    client_s: float
    """The node's FUSE client over the saving phase, less its calm-phase rate (the loader's reads) for as long,
    ÷ saves."""


def _at(samples: list[tuple[float, float, float]], t: float) -> tuple[float, float, float]:
    """The last sample at or before ``t`` (the first one when none is)."""
    before = [s for s in samples if s[0] <= t]
    return before[-1] if before else samples[0]


def save_cpu(samples: list[tuple[float, float, float]], *, calm: tuple[float, float], saving: tuple[float, float],
             saves: int, nodes: int) -> SaveCpu | None:
    """:class:`SaveCpu` from a sampler's ``samples``, the calm phase's and the saving phase's wall-time spans."""
    if len(samples) < 2 or saves <= 0 or calm[1] <= calm[0] or saving[1] <= saving[0]:
        return None
    c0, c1, s0, s1 = (_at(samples, t) for t in (*calm, *saving))
    calm_rate = (c1[2] - c0[2]) / max(c1[0] - c0[0], 1e-9)
    client = (s1[2] - s0[2]) - calm_rate * (s1[0] - s0[0])
    return SaveCpu(writer_s=(s1[1] - s0[1]) / saves / nodes, client_s=max(client, 0.0) / saves / nodes)
