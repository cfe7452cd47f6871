"""The probe's small-file phases: the cost of one fsync, and the store's rate of each metadata operation a commit
makes.

A commit's metadata work is a handful of kinds, each with its own cost on a parallel filesystem or an object store,
so each is measured alone, with the probe's writers sharing the small files (:data:`METADATA_KINDS`):

* ``create``: a new small file (an object PUT);
* ``stat``: the attributes of one (an object HEAD);
* ``rename``: a name moved within its directory (how POSIX publishes every file; object stores have none);
* ``list``: one directory level read (a listing request);
* ``fsync``: a 4 KiB rewrite of a small file made durable (what every publish waits for on POSIX);
* ``unlink``: a file removed (an object DELETE).

Rates are operations per second with the probe's writers at once. Everything is written under the probe's scratch
area (:mod:`ckptio.plan.measure.probe_targets`) and removed before the phase returns.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ckptio.plan.measure.clock import Clock
from ckptio.plan.measure.probe_targets import METADATA_KINDS, ProbeTarget

__all__ = ["METADATA_KINDS", "SmallFilePhases", "planner_ops_per_s"]

_FSYNC_SAMPLES = 20
_LIST_REPEATS = 20
# A few operations of each kind even when earlier phases used the time: a rate needs some.
_MIN_OPS_PER_WORKER = 4
#: Kinds the planner's single metadata rate averages (fsync is a device round trip with its own figure).
_PLANNER_KINDS = frozenset(METADATA_KINDS) - {"fsync"}


def planner_ops_per_s(rates: dict[str, float]) -> float:
    """The one rate the planner reads: the harmonic mean over the kinds measured other than fsync (a workload
    doing one operation of each kind in turn); 0 when none was."""
    ops = [v for k, v in rates.items() if v > 0 and k in _PLANNER_KINDS]
    return len(ops) / sum(1.0 / v for v in ops) if ops else 0.0


class SmallFilePhases:
    """The fsync and metadata phases of one probe run."""

    def __init__(self, target: ProbeTarget, *, workers: int, small_files: int, clock: Clock, payload: bytes,
                 parallel: Callable[[int, Callable[[int], Any]], list[Any]]) -> None:
        self.target, self.workers, self.small_files = target, workers, small_files
        self.clock, self.payload, self.parallel = clock, payload, parallel

    def fsync_cost(self, deadline: float) -> float | None:
        """Median seconds of one fsync of a freshly written small file (None where fsync means nothing)."""
        self.clock.report("fsync")
        costs: list[float] = []
        for i in range(_FSYNC_SAMPLES):
            if costs and self.clock.expired(deadline):
                break
            cost = self.target.fsync_cost(f"fsync/{i}", self.payload)
            if cost is None:
                return None
            costs.append(cost)
        self.target.remove_tree("fsync")
        return statistics.median(costs) if costs else None

    def metadata_rates(self, deadline: float) -> dict[str, float]:
        """Operations per second of each kind the target supports, in :data:`METADATA_KINDS` order."""
        live = [f"meta/{i:06d}" for i in range(self.small_files)]
        rates: dict[str, float] = {}
        for op in self.target.metadata_ops:
            if not live:
                break
            self.clock.report(f"metadata: {op}")
            start = time.monotonic()
            if op == "list":
                count = self._list_repeatedly(deadline)
            else:
                done = self._run_op(op, live, deadline)
                count = len(done)
                if op == "create":
                    live = done  # later ops touch only files that exist
            if count:
                rates[op] = count / max(time.monotonic() - start, 1e-9)
        self.target.remove_tree("meta")
        return rates

    def _list_repeatedly(self, deadline: float) -> int:
        count = 0
        while count < _LIST_REPEATS and (count < 1 or not self.clock.expired(deadline)):
            self.target.list_dir("meta")
            count += 1
        return count

    def _run_op(self, op: str, names: list[str], deadline: float) -> list[str]:
        """Apply ``op`` to ``names``, each worker thread taking every n-th; returns the names done."""
        workers = self.workers

        def work(shard: int) -> list[str]:
            done: list[str] = []
            for name in names[shard::workers]:
                if len(done) >= _MIN_OPS_PER_WORKER and self.clock.expired(deadline):
                    break
                self.target.metadata_op(op, name, self.payload)
                done.append(name)
            return done

        return [name for shard in self.parallel(workers, work) for name in shard]
