"""The planner held to the lab (issue 19, item 3): configurations of store link, node count and save interval; in
each, ``ckptio probe`` inside the nodes, ``ckptio plan`` and ``ckptio admit`` on what it measured, and the job run
for real (ckptio, one level, on the parallel FS), then restored from a cold page cache.

A configuration's interval is set from the lab's shape, never from the planner's answer: a comfortable one is
``SLACK`` × the time the store's link needs for the checkpoint plus ``COMMIT_ALLOWANCE_S`` (commits on a FUSE
filesystem across a shaped link take round trips), and the one the store cannot keep up with saves every
``TOO_FAST_STEPS`` steps. Then ``admit`` must refuse exactly that one.

Compared per configuration: the flush (first rank's request → last rank's durable record, the median over saves),
the time lost per save, and ``restore_s`` (every rank restoring the newest step at once, the slowest rank). A
prediction holds when predicted ÷ measured is within 0.8–1.2; for the time lost per save, also when the two differ
by at most 3 points of the interval (a few tens of milliseconds a save is below what the steps' own jitter lets the
lab resolve).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptio.demo.cluster import planner
from ckptio.demo.cluster.figures import TrainFigures, train_figures
from ckptio.demo.cluster.session import LabSession

SLACK = 2.5
COMMIT_ALLOWANCE_S = 2.0
TOO_FAST_STEPS = 3
STEP_GUESS_S = 0.12
"""A step's time, roughly, for setting intervals in steps (the plan is given the measured one)."""
LOST_POINTS = 0.03


@dataclass(frozen=True, slots=True)
class Point:
    """One configuration of the matrix."""

    store_mbit: float
    nodes: int
    fast: bool = False
    """Save faster than the store can take (the one ``admit`` must refuse)."""

    def label(self) -> str:
        return f"{self.store_mbit:g} Mbit, {self.nodes} nodes, {'too short' if self.fast else 'comfortable'}"


DEFAULT_POINTS = (Point(200, 2), Point(400, 2), Point(800, 2), Point(200, 4), Point(800, 4), Point(200, 4, True))


@dataclass
class PointResult:
    point: Point
    every: int
    figures: TrainFigures
    restore_s: float
    plan: dict[str, Any]
    admitted: bool
    reasons: list[str] = field(default_factory=list)

    def ratios(self) -> dict[str, float | None]:
        """predicted ÷ measured for flush, lost per save and restore_s."""
        lost = self.plan["modes"]["ckptio"]["lost_per_save_s"]
        return {"flush": _ratio(self.plan["flush_s"], self.figures.flush_s),
                "lost": _ratio(lost, self.figures.lost_per_save_s),
                "restore": _ratio(self.plan["restore_s"].get("durable"), self.restore_s)}

    def holds(self) -> dict[str, bool]:
        ratios = self.ratios()
        interval = self.every * self.figures.clean_step_s
        lost = self.plan["modes"]["ckptio"]["lost_per_save_s"]
        return {"flush": _within(ratios["flush"]), "restore": _within(ratios["restore"]),
                "lost": _within(ratios["lost"]) or abs(lost - self.figures.lost_per_save_s) <= LOST_POINTS * interval}

    @property
    def admit_right(self) -> bool:
        return self.admitted != self.point.fast


def _ratio(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return predicted / measured


def _within(ratio: float | None) -> bool:
    return ratio is not None and 0.8 <= ratio <= 1.2


def every_for(point: Point, *, state_mib: float, node_mbit: float) -> int:
    """The configuration's interval in steps, from the lab's shape alone."""
    if point.fast:
        return TOO_FAST_STEPS
    link = min(point.store_mbit, point.nodes * node_mbit) * 1e6 / 8
    seconds = SLACK * point.nodes * state_mib * 2**20 / link + COMMIT_ALLOWANCE_S
    return max(TOO_FAST_STEPS + 1, math.ceil(seconds / STEP_GUESS_S))


def run_point(session: LabSession, point: Point, *, state_mib: float, grad_mib: float, saves: int,
              out: Path, probes: dict[tuple[float, int], planner.StoreFigures]) -> PointResult:
    """Shape the store's link, probe (once per link and node count), run, restore, plan and admit."""
    lab = session.lab
    lab.reshape("store", point.store_mbit)
    nodes = list(range(point.nodes))
    key = (point.store_mbit, point.nodes)
    if key not in probes:
        probes[key] = planner.probe_store(session, nodes, "pfs", out / f"matrix-{point.store_mbit:g}-{point.nodes}",
                                          ranks_per_node=1)
    every = every_for(point, state_mib=state_mib, node_mbit=lab.config.node_mbit)
    root, host_root = session.pfs_root(f"matrix-{point.store_mbit:g}-{point.nodes}-{every}-{time.monotonic_ns()}")
    spec = {"phase": "train", "saver": "ckptio", "root": root, "state_mib": state_mib, "grad_mib": grad_mib,
            "every": every, "steps": every * saves, "calm_steps": 10, "hang": False, "restore_after": True,
            "options": {"keep_last": 2, "volume_check": "off", "lease_s": 0, "commit_timeout_s": 120}}
    job, _ = session.launch(spec, nodes, 1)
    try:
        records = [job.line(r, "result", 600.0)["result"] for r in range(point.nodes)]
        restored = [job.line(r, "restored", 600.0)["restored"] for r in range(point.nodes)]
        job.wait(120.0)
    finally:
        job.kill()
    figures = train_figures(records, [], every=every)
    shape = planner.JobShape(ranks=point.nodes, ranks_per_node=1, state_bytes_per_rank=state_mib * 2**20,
                             step_time_s=figures.clean_step_s, every=every)
    plan = planner.plan(shape, probes[key])
    verdict = planner.admit(shape, probes[key], str(host_root))
    return PointResult(point, every, figures, max(r["seconds"] for r in restored), plan,
                       admitted=verdict["exit_code"] == 0, reasons=list(verdict.get("reasons", [])))


def worst_ratio(results: list[PointResult]) -> float | None:
    """The ratio farthest from 1 (by factor) among the predictions held to their ratio."""
    ratios = [r for res in results for name, r in res.ratios().items()
              if r is not None and (name != "lost" or not res.holds()["lost"] or _within(r))]
    return max(ratios, key=lambda r: max(r, 1 / r)) if ratios else None


def median_ratio(results: list[PointResult], name: str) -> float | None:
    values = [r for res in results if (r := res.ratios()[name]) is not None]
    return statistics.median(values) if values else None
