"""The four ways the demo job saves: ``dcp.save``, default ``dcp.async_save``, DCP's best async path
("DCP-best") and ckptio, behind one small interface.

Each saver measures the same things the same way: the time the training loop spends in ``save`` (for the
async ones this includes waiting for the previous save, the usual one-in-flight discipline), the time the
next step waits for the staging copy before its optimizer step (``before_update``: DCP-best only), and the
lag from the save request until this rank's part is durable. The DCP savers write the obs event schema
themselves so the report can draw all four runs alike; ckptio writes its own events. This module must never
run a collective outside a save call, nor touch the training process group from a background thread (async
DCP gets its own gloo group)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, cast

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ckptio.demo.dcp_best import DcpBest
from ckptio.demo.job import StoreSpec
from ckptio.demo.throttled_store import ThrottledFileSystemWriter, ThrottleSpec
from ckptio.errors import WriterDiedError
from ckptio.obs.eventfiles import read_event_file
from ckptio.obs.events import EventLog, rank_path
from ckptio.storage import PosixStorage, Storage, open_storage


def step_dir(step: int) -> str:
    """The directory of one step, named like ckptio's layout so all four runs read alike."""
    return f"step-{step:08d}"


def open_demo_storage(spec: StoreSpec) -> Storage:
    """The run's store behind its shared bandwidth budget (what ckptio writes to)."""
    throttle = ThrottleSpec(bytes_per_s=spec.bytes_per_s, state_path=spec.throttle_state)
    if spec.kind == "posix":
        return throttle.posix(spec.root, fsync=spec.fsync)
    return throttle.wrap(open_storage(spec.root, **spec.options))


def committed_steps(storage: Storage, marker: str) -> list[int]:
    """Steps whose directory holds ``marker`` (``manifest.json`` for ckptio, ``.metadata`` for DCP)."""
    steps = []
    # cast: list_dirs says ``list[str]`` inside a class defining ``list``, which mypy misreads.
    for name in cast("list[str]", storage.list_dirs("")):
        if name.startswith("step-") and name[5:].isdigit() and storage.exists(f"{name}/{marker}"):
            steps.append(int(name[5:]))
    return sorted(steps)


def prune_older_steps(spec: StoreSpec, committed: list[int]) -> None:
    """Delete every step directory of a directory store but the newest committed one, once every run is measured:
    four modes x every save would otherwise leave gigabytes behind (the resume needs ckptio's newest only)."""
    if spec.kind != "posix" or not committed or not os.path.isdir(spec.root):
        return
    for name in os.listdir(spec.root):
        if name.startswith("step-") and name[5:].isdigit() and int(name[5:]) != committed[-1]:
            shutil.rmtree(os.path.join(spec.root, name), ignore_errors=True)


class Saver(Protocol):
    def ready(self) -> float:
        """Wait until saving can begin (ckptio: its writer process booted); returns the seconds waited."""

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Save ``state`` as ``step``; returns when the training loop may go on."""

    def before_update(self) -> float:
        """Called before each optimizer step: wait until the last save no longer reads the live state (its
        staging copy done); returns the seconds waited."""

    def drain(self) -> None:
        """Wait until every save is durable."""

    def lags(self) -> dict[int, float]:
        """Save request → durable, per step, as this rank saw it."""

    def committed(self) -> list[int]:
        """Steps committed in the store (read after ``drain``)."""

    def close(self) -> None:
        """Release processes, threads and groups."""


class _DcpSaver:
    """Shared parts of the two DCP savers: the throttled writer, the events, the lag bookkeeping."""

    def __init__(self, spec: StoreSpec, events: EventLog, bytes_per_save: int) -> None:
        self.spec = spec
        self.throttle = ThrottleSpec(bytes_per_s=spec.bytes_per_s, state_path=spec.throttle_state)
        self.events = events
        self.bytes_per_save = bytes_per_save
        self._lags: dict[int, float] = {}
        self._lock = threading.Lock()
        self._last_request: float | None = None

    def _writer(self, step: int) -> ThrottledFileSystemWriter:
        path = os.path.join(self.spec.root, step_dir(step))
        return ThrottledFileSystemWriter(path, throttle=self.throttle, sync_files=self.spec.fsync)

    def _requested(self, step: int) -> tuple[float, float | None]:
        """Record a save request; returns its time and the time since the previous request."""
        now = time.monotonic()
        self.events.emit("save_requested", step)
        interval = None if self._last_request is None else now - self._last_request
        self._last_request = now
        return now, interval

    def _returned(self, step: int, requested: float) -> float:
        returned = time.monotonic()
        self.events.emit("save_returned", step, blocking_s=returned - requested, bytes=self.bytes_per_save)
        return returned

    def _durable(self, step: int, requested: float, returned: float, interval: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            self._lags[step] = now - requested
        self.events.emit(
            "committed",
            step,
            flush_s=now - returned,
            bytes=self.bytes_per_save,
            lag_s=now - requested,
            interval_s=interval,
        )

    def _on_done(
        self, step: int, requested: float, returned: float, interval: float | None
    ) -> Callable[[Future[Any]], None]:
        def done(future: Future[Any]) -> None:
            if future.exception() is None:
                self._durable(step, requested, returned, interval)

        return done

    def lags(self) -> dict[int, float]:
        with self._lock:
            return dict(self._lags)

    def ready(self) -> float:
        return 0.0

    def before_update(self) -> float:
        return 0.0

    def committed(self) -> list[int]:
        return committed_steps(PosixStorage(self.spec.root, fsync=False), ".metadata")

    def close(self) -> None:
        pass


class DcpSyncSaver(_DcpSaver):
    """``torch.distributed.checkpoint.save``: every rank writes its part and waits for the others."""

    def save(self, step: int, state: dict[str, Any]) -> None:
        requested, interval = self._requested(step)
        dcp.save(state, storage_writer=self._writer(step))
        returned = self._returned(step, requested)
        self._durable(step, requested, returned, interval)

    def drain(self) -> None:
        pass


class DcpAsyncSaver(_DcpSaver):
    """``dcp.async_save`` with one save in flight, on a gloo group of its own (the documented pattern)."""

    def __init__(self, spec: StoreSpec, events: EventLog, bytes_per_save: int) -> None:
        super().__init__(spec, events, bytes_per_save)
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.pending: Future[Any] | None = None

    def save(self, step: int, state: dict[str, Any]) -> None:
        requested, interval = self._requested(step)
        self.drain()
        response: Any = dcp.async_save(state, storage_writer=self._writer(step), process_group=self.group)
        future: Future[Any] = getattr(response, "upload_completion", response)
        returned = self._returned(step, requested)
        future.add_done_callback(self._on_done(step, requested, returned, interval))
        self.pending = future

    def drain(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self) -> None:
        self.drain()
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None


class DcpBestSaver(_DcpSaver):
    """DCP-best (:class:`~ckptio.demo.dcp_best.DcpBest`, the benchmarks' own) on a gloo group of its own, writing
    through the run's throttled writer. The caller waits on its staging before the next optimizer step
    (:meth:`before_update`); each save waits for the previous one to be durable."""

    def __init__(self, spec: StoreSpec, events: EventLog, bytes_per_save: int) -> None:
        super().__init__(spec, events, bytes_per_save)
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.best = DcpBest(process_group=self.group)

    def save(self, step: int, state: dict[str, Any]) -> None:
        requested, interval = self._requested(step)
        response = self.best.save(state, self._writer(step))
        returned = self._returned(step, requested)
        response.upload_completion.add_done_callback(self._on_done(step, requested, returned, interval))

    def before_update(self) -> float:
        return self.best.wait_staged()

    def drain(self) -> None:
        self.best.wait()

    def close(self) -> None:
        self.best.wait()
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None
        self.best.close()


class CkptioSaver:
    """``ckptio.Checkpointer`` writing to the same throttled store; its events go to the run's event file."""

    def __init__(self, spec: StoreSpec, events_pattern: str, rank: int) -> None:
        import ckptio

        self.storage = open_demo_storage(spec)
        self.events_path = rank_path(events_pattern, rank)
        self.rank = rank
        self.checkpointer = ckptio.Checkpointer(
            root=self.storage, events_path=events_pattern, keep_last=0, max_pending=1, fsync=spec.fsync
        )
        self.pending: Any = None

    def ready(self, timeout_s: float = 300.0) -> float:
        # The writer boots a fresh interpreter that imports torch: seconds on a small machine. A real job
        # hides that behind its own start-up; the demo waits for it so step 1 is not measured against it.
        began = time.monotonic()
        if self.checkpointer.writer_ready(timeout_s):
            return time.monotonic() - began
        raise WriterDiedError(f"ckptio's writer did not start within {timeout_s:.0f} s", rank=self.rank)

    def save(self, step: int, state: dict[str, Any]) -> None:
        self.pending = self.checkpointer.save(step, state)

    def done(self) -> bool:
        """The last save is durable (or failed: :meth:`drain` raises its error)."""
        return self.pending is None or bool(self.pending.done())

    def staged_bytes(self) -> int:
        """The bytes of this rank's last save, as staged (0 before any)."""
        return 0 if self.pending is None else int(self.pending.bytes)

    def before_update(self) -> float:
        # save() returns before its copy into staging is done: the optimizer step must not change the state
        # under it, so the demo waits here, exactly where it waits for DCP-best's staging.
        began = time.monotonic()
        self.checkpointer.wait_staged()
        return time.monotonic() - began

    def drain(self) -> None:
        self.checkpointer.wait()

    def _records(self) -> list[dict[str, Any]]:
        # The writer may be appending right now: read_event_file(live=True) counts only whole lines.
        return read_event_file(self.events_path, live=True)

    def lags(self) -> dict[int, float]:
        return {
            int(record["step"]): float(record["lag_s"])
            for record in self._records()
            if record.get("event") == "committed" and record.get("lag_s") is not None
        }

    def committed(self) -> list[int]:
        return committed_steps(self.storage, "manifest.json")

    def close(self) -> None:
        self.checkpointer.close()
