"""The writer side in one process: real plans, staging slots as files, the writer's objects driven through their
message types, and an outbox that collects what a writer would send its trainer.

Plans come from DCP's own planner (as the trainer makes them); a slot is a file holding each tensor's bytes at its
layout offset (as the trainer's staging copy leaves it). Several "ranks" are several writers in this process,
each with its own rank and its own state (distinct keys per rank, so DCP's global plan keeps them all).
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from ckptio.config import CheckpointerConfig
from ckptio.engine.protocol import (
    FromWriter,
    JobLevels,
    Outbox,
    SaveDone,
    SaveDropped,
    SaveFailed,
    SaveJob,
    SlotFree,
    WriterEvent,
    WriterPlan,
    WriterStart,
)
from ckptio.engine.trainer.rank_plan import global_plan, make_planner, resolve_objects, split_items
from ckptio.format.layout import plan_layout
from ckptio.storage import open_storage
from ckptio.storage.base import Storage

OUTCOMES = (SaveDone, SaveFailed, SaveDropped)


class Inbox:
    """The trainer's end of the pipe, in memory: every message a writer sent, in order, and waits on them."""

    def __init__(self) -> None:
        self.messages: list[FromWriter] = []
        self._cond = threading.Condition()

    def send(self, msg: FromWriter) -> None:  # what Outbox calls on its "connection"
        with self._cond:
            self.messages.append(msg)
            self._cond.notify_all()

    def outbox(self, rank: int) -> Outbox:
        return Outbox(self, rank)  # type: ignore[arg-type]  # a Connection in the real writer; send() is all it uses

    def wait_for(self, found: Callable[[list[FromWriter]], Any], timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (result := found(self.messages)):
                left = deadline - time.monotonic()
                assert left > 0, f"timed out; messages so far: {self.summary()}"
                self._cond.wait(left)
            return result

    def outcome(self, save_id: int, timeout: float = 60.0) -> SaveDone | SaveFailed | SaveDropped:
        """The one outcome of save ``save_id``."""
        def find(msgs: list[FromWriter]) -> Any:
            return next((m for m in msgs if isinstance(m, OUTCOMES) and m.save_id == save_id), None)

        return self.wait_for(find, timeout)

    def outcomes(self, save_id: int) -> list[FromWriter]:
        return [m for m in self.messages if isinstance(m, OUTCOMES) and m.save_id == save_id]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [m.record for m in self.messages if isinstance(m, WriterEvent) and m.record["event"] == name]

    def slots_freed(self, save_id: int) -> int:
        return sum(1 for m in self.messages if isinstance(m, SlotFree) and m.save_id == save_id)

    def summary(self) -> list[str]:
        return [type(m).__name__ if not isinstance(m, WriterEvent) else m.record["event"] for m in self.messages]


def writer_start(root: str | Storage, *, rank: int = 0, world_size: int = 1, local: Storage | None = None,
                 **options: Any) -> WriterStart:
    """A WriterStart as a trainer builds it (no owner record: ownership is the trainer's and tested there)."""
    options.setdefault("commit_timeout_s", 20.0)
    durable = root if isinstance(root, Storage) else open_storage(root, fsync=False)
    config = CheckpointerConfig(root=durable, **options)
    return WriterStart(config=config.writer_config(), rank=rank, world_size=world_size, durable=durable,
                       local=local, owner=None)


@dataclass
class RankSave:
    """One rank's plan of a state, and how to stage a state of that structure into a slot file."""

    plan: WriterPlan
    objects: list[Any]

    def stage(self, state: dict[str, Any], slot: Path) -> tuple[str, int]:
        """Write ``state``'s tensors into ``slot`` at their layout offsets (what the staging copy does)."""
        layout = self.plan.layout
        buf = bytearray(max(layout.slot_bytes, 1))
        for entry in layout.tensors:
            raw = state[entry.fqn].contiguous().view(torch.uint8).numpy().tobytes()
            buf[entry.slot_offset : entry.slot_offset + entry.nbytes] = raw
        slot.write_bytes(bytes(buf))
        return str(slot), len(buf)


def plan_ranks(states: list[dict[str, Any]], *, plan_id: int = 1, file_size_bytes: int = 1 << 20) -> list[RankSave]:
    """Every rank's plan of its state (rank r saves ``states[r]``), through DCP's planner as the trainer does."""
    planners = [make_planner(state, is_coordinator=rank == 0) for rank, state in enumerate(states)]
    final, metadata = global_plan(planners[0], [p.create_local_plan() for p in planners])
    saves = []
    for rank, (planner, plan) in enumerate(zip(planners, final, strict=True)):
        tensors, objects = split_items(planner.finish_plan(plan).items)
        layout = plan_layout(rank, tensors + objects, file_size_bytes)
        skeleton = None
        if rank == 0:
            skeleton = pickle.dumps(type(metadata)(state_dict_metadata=metadata.state_dict_metadata,
                                                   planner_data=metadata.planner_data))
        saves.append(RankSave(WriterPlan(plan_id, layout, skeleton), objects))
    return saves


def save_job(rank_save: RankSave, state: dict[str, Any], slot: Path, *, step: int, save_id: int,
             levels: JobLevels | None = None, **fields: Any) -> SaveJob:
    path, nbytes = rank_save.stage(state, slot)
    objects = tuple(resolve_objects(state, rank_save.objects))
    return SaveJob(step=step, save_id=save_id, slot_id=0, slot_path=path, slot_nbytes=nbytes,
                   plan_id=rank_save.plan.plan_id, objects=objects, levels=levels or JobLevels(), **fields)


def load_step(step_dir: Path, like: dict[str, Any]) -> dict[str, Any]:
    """The step read back with plain ``dcp.load`` (ckptio's layout is a DCP checkpoint)."""
    out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else type(v)() for k, v in like.items()}
    dcp.load(out, checkpoint_id=str(step_dir))
    return out


def state(seed: int, *, keys: tuple[str, ...] = ("w",), numel: int = 4096) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(numel, generator=gen) for k in keys}


def eventually(cond: Callable[[], object], timeout: float = 30.0, why: Callable[[], object] = lambda: "") -> None:
    """Cleanup runs after the outcome is sent: wait for what it does (``why``: what to show if it never does)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"condition never held {why()}"
        time.sleep(0.01)


def two_level_starts(root: Path, tmp_path: Path, *, world_size: int = 2, local_storage: Any = None,
                     **options: Any) -> list[WriterStart]:
    """Each rank on a node of its own (``n0``, ``n1``...), its partner server listening on 127.0.0.1, the next
    node's rank its partner: what a two-level job's trainers send their writers."""
    import dataclasses
    import secrets
    import socket

    from ckptio.engine.protocol import LevelsStart, Peer

    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(world_size)]
    peers = tuple(Peer(r, f"n{r}", "127.0.0.1", s.getsockname()[1]) for r, s in enumerate(listeners))
    secret = secrets.token_bytes(32)
    starts = []
    for rank, listener in enumerate(listeners):
        local_dir = tmp_path / f"local{rank}"
        local = local_storage(rank, local_dir) if local_storage else open_storage(str(local_dir), fsync=False)
        start = writer_start(str(root), rank=rank, world_size=world_size, local=local, local_dir=str(local_dir),
                             durable_every=2, **options)
        levels = LevelsStart(node=f"n{rank}", listen_fd=listener.detach(), peers=peers,
                             partner_ranks=((rank + 1) % world_size,), timeout_s=10.0, secret=secret)
        starts.append(dataclasses.replace(start, levels=levels))
    return starts


def run(writer: Any, job: SaveJob) -> None:
    """What the writer process does with a SaveJob: register its step as live the moment it arrives (a cleanup
    running then finishes first), then run it on the pipeline."""
    writer.live.add(job.step)
    writer.run_job(job)
