"""The writer process (started as ``python -m ckptio.engine.writer FD NICE``, which takes its priority first): the
message loop, the heartbeat.

The writer is started as a fresh interpreter (not multiprocessing's spawn) so it never re-imports the user's
``__main__`` — training scripts without an ``if __name__ == "__main__"`` guard, notebooks and torchrun entry points
all work. The trainer passes one end of a socketpair as ``FD``; the first message is a
:class:`~ckptio.engine.protocol.WriterStart`. The work itself is ``engine.writer.pipeline`` and
``engine.writer.step_committer``; this module must never do any of it.

The main thread reads the pipe and registers each save's step as live the moment it arrives (cleanup must never
delete what a queued save is about to write); a pipeline thread runs the jobs in order. The writer ignores SIGINT
and SIGTERM: a Ctrl-C or a ``kill`` aimed at the job's process group must not lose the save in flight. It stops
when the trainer says so, or when the trainer is gone (the pipe closes): then it finishes the queued saves —
each bounded by ``commit_timeout_s`` — and exits. SIGKILL still ends it at once.
"""

from __future__ import annotations

import importlib
import os
import queue
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from ckptio.engine import process_hooks
from ckptio.engine.owner_record import OwnerRecord, heartbeat
from ckptio.engine.protocol import (
    Outbox,
    Reserved,
    SaveJob,
    SaveRelease,
    SaveReserve,
    WriterHurry,
    WriterPlan,
    WriterStart,
    WriterStop,
    WriterStopped,
)
from ckptio.engine.writer.flush_pacer import FlushPacer
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.pipeline import Writer
from ckptio.errors import RootInUseError
from ckptio.obs.events import Event
from ckptio.storage.base import Storage


def _keep_heartbeat(durable: Storage, owner: OwnerRecord, stop: threading.Event) -> None:
    """Rank 0 keeps the root's owner record fresh (compare-and-swap) for as long as its writer runs."""
    while not stop.wait(owner.lease_s / 3):
        try:
            heartbeat(durable, owner)
        except RootInUseError:
            return  # another job took the root: owner.lost is set, and the committer refuses every later commit


def _serve(conn: Connection, out: Outbox, live: LiveSteps, pacer: FlushPacer,
           work: queue.Queue[WriterPlan | SaveJob | None]) -> None:
    """Read messages until ``WriterStop`` or the trainer goes away; plans and jobs go to the pipeline in order."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        match msg:
            case WriterStop():
                pacer.hurry()  # close(): the saves still queued go at full speed
                return
            case WriterHurry():
                pacer.hurry()
            case WriterPlan():
                work.put(msg)
            case SaveJob():
                live.add(msg.step)  # before it is queued: a cleanup running now finishes first
                pacer.job_arrived()  # a paced flush never makes the next save wait
                work.put(msg)
            case SaveReserve():
                live.add(msg.step)
                out.send(Reserved(msg.step))
            case SaveRelease():
                live.remove(msg.step)
            case _:
                raise TypeError(f"unexpected message to the writer: {type(msg).__name__}")


def _run_pipeline(writer: Writer, work: queue.Queue[WriterPlan | SaveJob | None]) -> None:
    while (item := work.get()) is not None:
        if isinstance(item, WriterPlan):
            writer.add_plan(item)
        else:
            writer.run_job(item)


def writer_main(conn: Connection, start: WriterStart) -> None:
    """Process body: serve jobs until ``WriterStop`` or the trainer goes away, then say ``WriterStopped``."""
    out = Outbox(conn, start.rank)
    out.event(Event.WRITER_STARTED, None, pid=os.getpid())
    if start.rank == 0:
        # Rank 0's committer needs DCP's classes for .metadata (seconds to import torch): load them in the
        # background now, so the first commit does not pay for it. Other ranks' writers never import torch.
        threading.Thread(target=importlib.import_module, args=("ckptio.engine.writer.dcp_metadata",),
                         name="ckptio-preload", daemon=True).start()
    live = LiveSteps()
    writer = Writer(start, out, live)
    stop_heartbeat = threading.Event()
    if start.owner is not None:
        threading.Thread(target=_keep_heartbeat, args=(start.durable, start.owner, stop_heartbeat),
                         name="ckptio-heartbeat", daemon=True).start()
    work: queue.Queue[WriterPlan | SaveJob | None] = queue.Queue()
    pipeline = threading.Thread(target=_run_pipeline, args=(writer, work), name="ckptio-pipeline", daemon=True)
    pipeline.start()
    try:
        _serve(conn, out, live, writer.pacer, work)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        work.put(None)
        pipeline.join()
        stop_heartbeat.set()
        writer.close()
        out.send(WriterStopped())


def main() -> None:
    # The writer imports torch only where it must (rank 0's commit, a tensor torchsave cannot frame); torch then
    # starts with one intra-op thread: serialization is memcpy-bound, the cores belong to training.
    os.environ["OMP_NUM_THREADS"] = "1"
    process_hooks.writer_ignores_termination()  # the trainer decides when this process stops
    conn = Connection(int(sys.argv[1]))
    start = conn.recv()
    if not isinstance(start, WriterStart):
        raise TypeError(f"the writer's first message must be WriterStart, got {type(start).__name__}")
    writer_main(conn, start)


