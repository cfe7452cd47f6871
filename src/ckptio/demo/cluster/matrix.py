"""The planner held to the lab: configurations of store link, node count and save interval; in
each, ``ckptio probe`` inside the nodes, ``ckptio plan`` and ``ckptio admit`` on what it measured, and the job run
for real (ckptio, one level, on the parallel FS), then restored from a cold page cache.

A configuration's interval is set from the lab's shape, never from the planner's answer: a comfortable one is
``SLACK`` × the time the store's link needs for the checkpoint plus ``COMMIT_ALLOWANCE_S`` (commits on a FUSE
filesystem across a shaped link take round trips), and the one the store cannot keep up with saves every
``TOO_FAST_STEPS`` steps. Then ``admit`` must refuse exactly that one.

The interval the store cannot keep up with runs ``QUEUED_SAVES`` saves: enough that the saves waiting in host
memory (``max_pending``) run out and the later ones wait for the writer, the steady state the planner predicts
(fewer would measure only the queue filling). Its flush is the store's time per save once saves queue: the median
gap between consecutive saves' last durable records (request → durable would count the queue, which grows with the
run's length).

Compared per configuration: the flush (first rank's request → last rank's durable record, the median over saves,
against ``plan``'s ``commit_lag_s``, the flush and then the commit's operations in series; the queued saves' pace
against its ``flush_s``), the time lost per save, and ``restore_s`` (every rank restoring the newest step at once,
the slowest rank). A prediction holds when predicted ÷ measured is within 0.8–1.2; for the time lost per save, also
when the two differ by at most 3 points of the interval (a few tens of milliseconds a save is below what the steps'
own jitter lets the lab resolve).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptio.demo.cluster import planner
from ckptio.demo.cluster.figures import TrainFigures, queued_flush_s, train_figures
from ckptio.demo.cluster.session import LabSession

SLACK = 2.5
COMMIT_ALLOWANCE_S = 2.0
TOO_FAST_STEPS = 3
QUEUED_SAVES = 7
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


DEFAULT_POINTS = (Point(800, 4), Point(800, 4, True), Point(200, 4), Point(200, 4, True), Point(400, 2),
                  Point(400, 2, True))
"""Three store links, each with a comfortable interval and one the store cannot keep up with; 4 nodes on the
fastest and slowest link, 2 on the middle one. One probe per link: the demo's probe is the 800 Mbit one (its lab
is the matrix's, at the same shape)."""


@dataclass(frozen=True, slots=True)
class StoreBytes:
    """What crossed the store's link during a configuration's run (its htb counters), beside the checkpoint bytes
    its saves wrote (every save, the untimed first one too): a store link that carried fewer bytes than the
    checkpoints hold would mean the store skipped some (MooseFS sends no all-zero blocks) and every flush and
    restore figure would look faster than the link allows. ``read`` includes the restore's bytes."""

    written: int
    read: int
    checkpoints: float

    @property
    def written_share(self) -> float:
        """Bytes into the store ÷ the checkpoints' bytes (≥ 1: every byte crossed, plus the protocol's)."""
        return self.written / self.checkpoints if self.checkpoints else 0.0


@dataclass
class PointResult:
    point: Point
    every: int
    figures: TrainFigures
    restore_s: float
    plan: dict[str, Any]
    admitted: bool
    reasons: list[str] = field(default_factory=list)
    carried: StoreBytes | None = None

    def planned_flush_s(self) -> float:
        """What the measured flush is held to: a comfortable interval's is measured to the commit; queued saves'
        pace is the store's alone."""
        return float(self.plan["flush_s"] if self.point.fast else self.plan["commit_lag_s"])

    def ratios(self) -> dict[str, float | None]:
        """predicted ÷ measured for flush, lost per save and restore_s."""
        lost = self.plan["modes"]["ckptio"]["lost_per_save_s"]
        return {"flush": _ratio(self.planned_flush_s(), self.figures.flush_s),
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


def run_link(session: LabSession, points: list[Point], *, state_mib: float, grad_mib: float, saves: int,
             out: Path, probes: dict[tuple[float, int], planner.StoreFigures]) -> list[PointResult]:
    """Configurations that share a store link and a node count: shape the link, probe (unless ``probes`` has
    that link and node count), run their intervals one after the other in one launch of the job (one import, one
    writer boot), restore once (``restore_s`` does not depend on the interval), then plan and admit each."""
    point = points[0]
    assert all((p.store_mbit, p.nodes) == (point.store_mbit, point.nodes) for p in points), points
    session.lab.reshape("store", point.store_mbit)
    nodes = list(range(point.nodes))
    key = (point.store_mbit, point.nodes)
    if key not in probes:
        probes[key] = planner.probe_store(session, nodes, "pfs", out / f"matrix-{point.store_mbit:g}-{point.nodes}",
                                          ranks_per_node=1)
    everys = [every_for(p, state_mib=state_mib, node_mbit=session.lab.config.node_mbit) for p in points]
    root, host_root = session.pfs_root(f"matrix-{point.store_mbit:g}-{point.nodes}-{time.monotonic_ns()}")
    spec = {"phase": "train", "saver": "ckptio", "root": root, "state_mib": state_mib, "grad_mib": grad_mib,
            "intervals": [[every, every * _saves(p, saves)] for p, every in zip(points, everys, strict=True)],
            "calm_steps": 10, "hang": False,
            "restore_after": True,
            "options": {"keep_last": 2, "volume_check": "off", "lease_s": 0, "commit_timeout_s": 120}}
    before = _store_bytes(session)
    job, _ = session.launch(spec, nodes, 1)
    try:
        records = [[job.line(r, "result", 600.0)["result"] for r in range(point.nodes)] for _ in points]
        restored = [job.line(r, "restored", 600.0)["restored"] for r in range(point.nodes)]
        job.wait(120.0)
    finally:
        job.kill()
    after = _store_bytes(session)
    carried = StoreBytes(written=after.written - before.written, read=after.read - before.read,
                         checkpoints=(sum(_saves(p, saves) for p in points) + 1) * point.nodes * state_mib * 2**20)
    restore_s = max(r["seconds"] for r in restored)
    return [_judge(p, every, _figures(p, phase, every), restore_s=restore_s, store=probes[key],
                   root=str(host_root), state_mib=state_mib, grad_mib=grad_mib,
                   node_mbit=session.lab.config.node_mbit, carried=carried)
            for p, every, phase in zip(points, everys, records, strict=True)]


def _saves(point: Point, saves: int) -> int:
    return max(saves, QUEUED_SAVES) if point.fast else saves


def _figures(point: Point, records: list[dict[str, Any]], every: int) -> TrainFigures:
    figures = train_figures(records, [], every=every)
    return replace(figures, flush_s=queued_flush_s(records)) if point.fast else figures


def _judge(point: Point, every: int, figures: TrainFigures, *, restore_s: float, store: planner.StoreFigures,
           root: str, state_mib: float, grad_mib: float, node_mbit: float, carried: StoreBytes) -> PointResult:
    """``plan`` and ``admit`` of one configuration, on its probed store and its measured step."""
    shape = planner.JobShape(ranks=point.nodes, ranks_per_node=1, state_bytes_per_rank=state_mib * 2**20,
                             step_time_s=figures.clean_step_s, every=every, network_bytes_per_s=node_mbit * 1e6 / 8,
                             grad_bytes=grad_mib * 2**20)
    verdict = planner.admit(shape, store, root)
    return PointResult(point, every, figures, restore_s, planner.plan(shape, store),
                       admitted=verdict["exit_code"] == 0, reasons=list(verdict.get("reasons", [])), carried=carried)


def by_link(points: tuple[Point, ...]) -> list[list[Point]]:
    """The points grouped by store link and node count, in first-seen order (one launch each)."""
    groups: dict[tuple[float, int], list[Point]] = {}
    for point in points:
        groups.setdefault((point.store_mbit, point.nodes), []).append(point)
    return list(groups.values())


def _store_bytes(session: LabSession) -> StoreBytes:
    counts = session.lab.link_bytes("store")
    return StoreBytes(written=sum(counts["down"].values()), read=sum(counts["up"].values()), checkpoints=0.0)


def worst_ratio(results: list[PointResult]) -> float | None:
    """The ratio farthest from 1 (by factor) among the predictions held to their ratio."""
    ratios = [r for res in results for name, r in res.ratios().items()
              if r is not None and (name != "lost" or not res.holds()["lost"] or _within(r))]
    return max(ratios, key=lambda r: max(r, 1 / r)) if ratios else None


def median_ratio(results: list[PointResult], name: str) -> float | None:
    values = [r for res in results if (r := res.ratios()[name]) is not None]
    return statistics.median(values) if values else None
