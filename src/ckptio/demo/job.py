"""What the launcher tells each rank, and what each rank reports back: two small JSON documents.

The launcher writes one :class:`RankJob` per run; every rank reads it, trains, and writes a
:class:`RankResult`. Keeping both as plain dataclasses that round-trip through JSON keeps the rank processes
free of launcher state. This module must never start processes or touch torch.distributed."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ckptio.demo.model import ModelShape
from ckptio.errors import ConfigError

Mode = Literal["dcp-sync", "dcp-async", "dcp-best", "ckptio", "resume", "calibrate"]
MODES: tuple[Mode, ...] = ("dcp-sync", "dcp-async", "dcp-best", "ckptio", "resume", "calibrate")


def save_steps(*, every: int, steps: int) -> list[int]:
    """Steps ending with a save in a run of ``steps`` saving every ``every``: multiples of ``every`` before the last
    (a resume needs a next step)."""
    return list(range(every, steps, every))


@dataclass(kw_only=True, slots=True)
class StoreSpec:
    """Where a run writes, and the bandwidth budget it shares."""

    kind: Literal["posix", "s3"] = "posix"
    """``posix``: a directory; ``s3``: a bucket on the demo's embedded S3 server."""

    root: str
    """The directory (posix) or ``s3://bucket/prefix`` URL (s3) of this run's checkpoints."""

    bytes_per_s: float
    """Write bandwidth of the emulated store, shared by every rank and every writer of the run."""

    throttle_state: str
    """The file holding the shared throttle clock."""

    fsync: bool = True
    """fsync data as a real filesystem client would."""

    options: dict[str, Any] = field(default_factory=dict)
    """Extra storage options (S3: ``endpoint_url``, ``region``)."""


@dataclass(kw_only=True, slots=True)
class RankJob:
    """One launch of the demo job's ranks, identical for every rank: one or more runs, one after the other."""

    runs: list[Mode]
    """The runs, in order: training runs (``dcp-sync``, ``dcp-async``, ``dcp-best``, ``ckptio``) share one launch;
    ``resume`` (restore the newest ckptio step) is a launch of its own, so it starts from fresh processes, and so
    is ``calibrate`` (the planner's measurement of what ``O_DIRECT`` writes cost the step, before any run)."""

    world: int
    """Number of ranks."""

    store_port: int
    """Port of the launcher's TCPStore on 127.0.0.1 (the rendezvous)."""

    steps: int
    """Training steps of an uninterrupted run (resume trains from the restored step up to this)."""

    every: int
    """Save at every multiple of this step, except the last step."""

    seed: int
    """Seed of the model and of the synthetic data."""

    shape: ModelShape
    """Model and data sizes."""

    stores: dict[str, StoreSpec]
    """The checkpoint store of each run (``resume`` reads ckptio's)."""

    events_dir: str
    """Where each rank writes its JSONL events (``<run>.rank<N>.jsonl``)."""

    results_dir: str
    """Where each rank writes its :class:`RankResult` (``<run>.rank<N>.json``)."""

    progress_path: str
    """Rank 0 overwrites this file with the run and step it is on, for the launcher's progress bar."""

    dcp_copy_root: str | None = None
    """Resume runs: the ``dcp.save`` run's directory store, whose checkpoint of the restored step (the same state,
    saved by DCP) plain ``dcp.load`` reads for the restore comparison; None: no comparison."""

    def __post_init__(self) -> None:
        unknown = [run for run in self.runs if run not in MODES or run not in self.stores]
        if not self.runs or unknown:
            raise ConfigError(f"bad demo runs {self.runs!r} (stores for {sorted(self.stores)})")
        for alone in ("resume", "calibrate"):
            if alone in self.runs and len(self.runs) > 1:
                raise ConfigError(f"a {alone} must be a launch of its own")
        if self.world < 1 or self.steps < 2 or self.every < 1:
            raise ConfigError(f"bad run size: world={self.world} steps={self.steps} every={self.every}")

    @property
    def bytes_per_rank(self) -> int:
        """The state each rank saves: an equal share of the model's."""
        return self.shape.state_bytes() // self.world

    def save_steps(self) -> list[int]:
        """Steps ending with a save (:func:`save_steps`)."""
        return save_steps(every=self.every, steps=self.steps)

    def events_path(self, run: Mode, rank: int) -> str:
        return self.events_pattern(run).replace("{rank}", str(rank))

    def events_pattern(self, run: Mode) -> str:
        """A run's event files with ``{rank}`` for the rank (the form ckptio's ``events_path`` takes)."""
        return os.path.join(self.events_dir, f"{run}.rank{{rank}}.jsonl")

    def result_path(self, run: Mode, rank: int) -> str:
        return os.path.join(self.results_dir, f"{run}.rank{rank}.json")

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def load(cls, path: str) -> RankJob:
        with open(path) as f:
            raw = json.load(f)
        raw["shape"] = ModelShape(**raw["shape"])
        raw["stores"] = {run: StoreSpec(**spec) for run, spec in raw["stores"].items()}
        return cls(**raw)


@dataclass(kw_only=True, slots=True)
class SaveRecord:
    """One save as one rank saw it."""

    step: int
    """The step saved."""

    blocking_s: float
    """Time the training loop spent in the save call (waiting for the previous save included)."""

    staging_wait_s: float = 0.0
    """Time the next step waited, before its optimizer step, for this save's staging copy (DCP-best's
    ``staging_completion``); 0 for savers that copy inside the save call."""

    lag_s: float | None = None
    """Save request → durable on this rank (DCP: future done; ckptio: the step committed); None if unknown."""


@dataclass(kw_only=True, slots=True)
class RankResult:
    """What one rank measured."""

    mode: Mode
    """The run."""

    rank: int
    """This rank."""

    step_seconds: dict[int, float] = field(default_factory=dict)
    """Wall time of each training step, the save at its end included."""

    losses: dict[int, float] = field(default_factory=dict)
    """Loss of each step (the same on every rank)."""

    saves: list[SaveRecord] = field(default_factory=list)
    """Every save of the run."""

    ready_s: float = 0.0
    """Time waited before step 1 for the saver to be ready (ckptio: its writer process booting)."""

    first_durable_s: float | None = None
    """First save() call → durable on this rank: the run waits for it before training on, so its one-time
    costs (planning, slots, DCP's process spawn) stay out of the steady saves after it."""

    rank_cpu_s: float = 0.0
    """CPU seconds of this rank's process from step 1 to the last save durable (training, staging, DCP's
    in-process threads)."""

    saver_cpu_s: float = 0.0
    """CPU seconds of this rank's child processes over the same span (ckptio's writer, DCP-best's checkpoint
    process)."""

    drain_s: float = 0.0
    """Time waiting for the last saves to become durable after the last step."""

    committed: list[int] = field(default_factory=list)
    """Steps found committed in the store at the end (rank 0 only)."""

    restored_step: int | None = None
    """Resume runs: the step restored."""

    restore_s: float | None = None
    """Resume runs: ckptio's ``restore`` on this rank, every rank starting together from a cold page cache."""

    dcp_load_s: float | None = None
    """Resume runs: plain ``dcp.load`` of the ``dcp.save`` copy of the same step into a second model on this rank,
    every rank starting together from a cold page cache; None without such a copy."""

    page_cache: str | None = None
    """Resume runs, rank 0: how the page cache was emptied before each timed read (``drop_caches``, ``fadvise``),
    or why it was not."""

    trial_lost_s: float | None = None
    """Calibrate runs: what a trial ckptio save cost this rank's steps
    (:func:`ckptio.plan.measure.training.measure_save_loss`)."""

    trial_bytes: int | None = None
    """Calibrate runs: the bytes this rank's trial saves staged. The ranks' shares differ: DCP's planner, which
    ckptio and the DCP modes share, writes each replicated tensor from one rank."""

    wall_s: float = 0.0
    """From the start of the run's set-up (saver, model) to its last save being durable."""

    def dump(self, path: str) -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(asdict(self), f)
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, path: str) -> RankResult:
        with open(path) as f:
            raw = json.load(f)
        raw["step_seconds"] = {int(k): v for k, v in raw["step_seconds"].items()}
        raw["losses"] = {int(k): v for k, v in raw["losses"].items()}
        raw["saves"] = [SaveRecord(**s) for s in raw["saves"]]
        return cls(**raw)
