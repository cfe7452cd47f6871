"""The writer's flush threads: every write of a save's files (the first tier, the durable upload) runs here.

:class:`Flushes` holds the pool of ``upload_concurrency`` threads and the :class:`FlushPacer`. A flush is a
``with flushes.flush(job, tier)`` block at the job's pace, reported as a ``flush_paced`` event when it was paced and
went well; :meth:`Flushes.run_all` runs one function per file and waits for *every* call before raising the first
failure, because the failure path deletes the attempt's files and must not race a write still in flight.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ckptio.engine.protocol import Outbox, SaveJob
from ckptio.engine.writer.flush_pacer import FlushPacer, PacedFlush
from ckptio.obs.events import Event

T = TypeVar("T")
R = TypeVar("R")


class Flushes:
    """The pool and the pace of one writer's flushes."""

    def __init__(self, out: Outbox, *, concurrency: int, pacer: FlushPacer | None = None) -> None:
        self.out = out
        self.pacer = pacer or FlushPacer()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ckptio-up")

    @contextlib.contextmanager
    def flush(self, job: SaveJob, tier: str, *, paced: bool = True) -> Iterator[PacedFlush]:
        """One flush of ``job`` to ``tier`` at the job's pace (full speed unless ``paced``)."""
        with self.pacer.begin(job.pace_bytes_per_s if paced else None) as flush:
            yield flush
        report = flush.report
        if report is not None:
            self.out.event(Event.FLUSH_PACED, job.step, tier=tier, target_bytes_per_s=report.target_bytes_per_s,
                           achieved_bytes_per_s=report.achieved_bytes_per_s, stretched_s=report.stretched_s,
                           bytes=report.bytes, seconds=report.seconds, hurried=report.hurried)

    def run_all(self, fn: Callable[[T], R], args: Iterable[T]) -> list[R]:
        """``fn`` of each argument, concurrently; every call has ended before the first failure is raised."""
        futures = [self._pool.submit(fn, arg) for arg in args]
        concurrent.futures.wait(futures)
        return [fut.result() for fut in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
