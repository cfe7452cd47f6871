"""What a save costs the training step, per save mode: the blocking part, and the CPU the background writer takes.

Owns the background-cost model of the planner (its derivation is in docs/planning.md, "What a save costs the
step"): from the host's cores per rank, training's own CPU use, and the per-byte CPU costs of each piece of work a
save does (:class:`WriterCosts`, measured by :func:`ckptio.plan.measure.host.measure_writer_costs`), it predicts for
each
of :data:`MODES` the time ``save()`` blocks, the CPU the rest of the save takes while training goes on, how much
of that CPU comes out of training's share of the cores, the step inflation while the flush runs, and the training
time lost per save. It must never measure anything (``host`` does) and never touch storage: the store's part
arrives as ``store_s``, the seconds the bytes take to reach it (``budget`` computes it).

The modes:

* ``dcp_sync`` — ``torch.distributed.checkpoint.save``: training waits for the whole write.
* ``dcp_async`` — default ``dcp.async_save``: a blocking copy into freshly allocated memory (three of them for a
  CPU DTensor: see ``dtensor_share``), then a thread of the training process writes with ``torch.save`` (zip CRC on)
  and fsyncs each file, at the trainer's priority; while that copy lives, a CPU job's own steps may run slower
  (:attr:`HostModel.fresh_copy_drag`).
* ``dcp_best`` — ``dcp.async_save`` with a PROCESS checkpointer and a ``DefaultStager`` (async staging into cached
  shared memory): the copy runs in a staging thread of the training process, the write in a separate process,
  both at the trainer's priority; ``save()`` itself blocks for next to nothing.
* ``ckptio`` — the copy into a reused shared-memory slot runs on a staging thread; a writer process at
  ``writer_nice`` checksums (crc32c) and writes the slot's bytes, with ``O_DIRECT`` through a small bounce buffer on
  a durable POSIX tier (no page-cache allocation), through the page cache or a socket elsewhere.

On a durable POSIX tier the device's I/O may cost the steps more than the writers' CPU: every background mode is
charged :attr:`HostModel.direct_io_s_per_gib` for its bytes (DCP's, :attr:`HostModel.buffered_io_s_per_gib` where a
trial of their own writer measured it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ckptio.errors import ConfigError

GIB = float(1 << 30)
"""Bytes in a GiB: the unit of :attr:`HostModel.direct_io_s_per_gib`."""
MODES = ("dcp_sync", "dcp_async", "dcp_best", "ckptio")
"""Save modes the planner predicts, in the order tables print them."""

CKPTIO_WRITER_NICE = 10
"""ckptio's default ``writer_nice`` (:class:`ckptio.config.CheckpointerConfig`)."""

_NICE_0_WEIGHT = 1024.0
"""Linux CFS weight of a nice-0 task; each nice level divides it by about 1.25 (``sched_prio_to_weight``)."""


def cfs_weight(nice: int) -> float:
    """The scheduler weight of a task at ``nice`` (CFS: 1024 at 0, ÷1.25 per level)."""
    return _NICE_0_WEIGHT / 1.25**nice


@dataclass(kw_only=True, slots=True, frozen=True)
class WriterCosts:
    """Bytes per CPU-second of one core, per piece of work a save does (``host.measure_writer_costs``); DCP-best's
    per-entry work is counted in state entries (:attr:`dcp_items_per_s`).

    The defaults were measured on a small 2-core cloud VM (2026) with ``ckptio.plan.measure.host.measure_writer_costs``;
    give the figures of the host the job runs on when they matter.
    """

    copy_bytes_per_s: float = 8e9
    """Copy into memory already allocated and touched (ckptio's staging slot, DCP-best's cached shared memory)."""

    fresh_copy_bytes_per_s: float = 1.7e9
    """Copy into freshly allocated memory, page faults included (default ``async_save``'s stager)."""

    checksum_bytes_per_s: float = 11e9
    """crc32c over the bytes (ckptio's per-file checksum)."""

    page_cache_bytes_per_s: float = 0.5e9
    """``write()`` of bytes into a new file through the page cache, its page allocation included (the client side
    of a write; no fsync). On a VM whose free memory returns to the hypervisor the allocation dominates."""

    torch_save_bytes_per_s: float = 0.4e9
    """``torch.save`` of a tensor into a new file, zip CRC32 on, then fsync (what DCP's FileSystemWriter does per
    file with ``sync_files`` on, its default)."""

    direct_write_bytes_per_s: float = 5e9
    """``O_DIRECT`` write of new bytes through ckptio's bounce buffer (``ckptio.storage.direct_io``): the bounce
    copy and the system calls; the device moves the bytes by DMA."""

    dcp_items_per_s: float = 2000.0
    """State items (tensors, other values), not bytes, per CPU-second: what DCP-best's saves spend per item beyond
    its bytes (planning and metadata, and the pipe that hands the staged shared-memory state dict to the checkpoint
    process, each storage's file descriptor passed on its own). Not probed: measured on a 2-vCPU VM (2026-12-05),
    0.4–0.6 ms per item, trainer and checkpoint process together (docs/planning-measurements.md)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"writer cost {f.name} must be > 0, got {value!r}")

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, float]) -> WriterCosts:
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in known})


@dataclass(kw_only=True, slots=True, frozen=True)
class HostModel:
    """The host as the background-cost model sees it, per rank."""

    cores_per_rank: float = 8.0
    """CPU cores of the host divided by the ranks on it (a GPU node: 8 GPUs, 64+ cores)."""

    train_cores: float = 1.0
    """Cores training keeps busy per rank while it steps: its threads' CPU time ÷ step time. A GPU job's Python
    thread is about 1; a CPU job is its torch threads. What it does not use is the spare a writer can take, except
    in a CPU job whose ranks wait for each other (:meth:`waiting_for_peers`)."""

    writer_nice: int = CKPTIO_WRITER_NICE
    """Niceness of ckptio's writer process (DCP's writers run at the trainer's priority)."""

    cpu_share: float = 1.0
    """Share of a core a runnable thread of this rank gets: 1 on a host of its own; on a shared one, CPU time ÷
    (CPU time + run-queue wait) of the training thread (Linux ``/proc/thread-self/schedstat``). CPU work on the
    training thread takes 1/share longer in wall time."""

    fresh_copy_drag: float = 0.0
    """How much slower a training step runs while a freshly allocated copy of the state is alive: step time with
    one ÷ without, − 1 (:func:`ckptio.plan.measure.host.measure_fresh_copy_drag` measures it). Default ``async_save``
    stages
    into new memory and keeps it until its write is done; in a CPU job whose steps allocate and free large host
    buffers (gradients, FSDP's all-gathered parameters), that copy takes the memory glibc's heap was recycling
    for them, the buffers land above it and are trimmed back to the kernel at every free, and every step faults
    them in again until the copy is freed (measured: gone with ``MALLOC_TRIM_THRESHOLD_`` set high). A GPU job
    keeps those buffers on the device: 0."""

    direct_io_s_per_gib: float = 0.0
    """Training seconds the job loses per GiB a rank's writer moves to the store's device while training runs,
    beyond what the model charges from CPU costs (a save's staging copy and its writer's CPU); measured through
    ckptio's ``O_DIRECT`` writer, hence the name: :func:`~ckptio.plan.costs.calibration.excess_from_trial` takes it
    from a trial save of ckptio's own writer on the job's ranks and store
    (:func:`ckptio.plan.measure.host.measure_save_loss`), every rank saving at once, so the figure is already the job's,
    lockstep included. The device's I/O is not free for the cores: on a VM the hypervisor emulates the disk and
    its interrupts on the vCPUs training runs on (a kernel without ``CONFIG_IRQ_TIME_ACCOUNTING`` charges
    interrupt time to whichever task they interrupt, and the host's steal grows), and a save's cost outlives its
    durability by a few steps. Measured on one 2-vCPU VM: 0.5–1.5 s/GiB; earlier VMs showed no such cost (ckptio
    lost within 0.05 s of its CPU there). The background DCP modes are charged it too (not ``dcp.save``, whose
    I/O lands while training waits for it): their write-back moves the same bytes to the same device, and on a
    2-vCPU VM (2026-12-04) their loss beyond the model's CPU charge was of the order of what ckptio's trial left
    over (their writers' CPU in flight mostly read 1.2–1.4× the probe's); on an earlier VM their write-back had
    cost about its CPU (docs/planning.md). Not charged where ckptio writes without ``O_DIRECT`` (``direct_io``
    False: a tmpfs, a socket), where no trial measures it. Where a trial of a buffered writer measures the DCP
    modes' own figure (:attr:`buffered_io_s_per_gib`), they are charged that instead."""

    buffered_io_s_per_gib: float | None = None
    """As :attr:`direct_io_s_per_gib`, for DCP's background writers (``torch.save`` through the page cache, fsync,
    at the trainer's priority): what they cost the steps per GiB beyond the model's CPU charge, taken by
    :func:`~ckptio.plan.costs.calibration.excess_from_trial` from a trial save of DCP-best on the job's ranks and store,
    charged to default ``async_save`` and DCP-best. None: no such trial; they are charged
    :attr:`direct_io_s_per_gib`. Why a trial of their own: ckptio's ``O_DIRECT`` trial measures a different writer's
    I/O, and what a VM makes of a buffered one (its page-cache pages' first touch, the write-back's interrupts, the
    ranks' bursts drifting apart) is not what it makes of ``O_DIRECT`` (on the 2026-12-05 VM ckptio's trial cost
    nothing beyond its CPU). bench_planner runs it."""

    def __post_init__(self) -> None:
        for name in ("fresh_copy_drag", "direct_io_s_per_gib", "buffered_io_s_per_gib"):
            value = getattr(self, name)
            if value is None and name == "buffered_io_s_per_gib":
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.cpu_share, (int, float)) and 0 < self.cpu_share <= 1):
            raise ConfigError(f"cpu_share must be within (0, 1], got {self.cpu_share!r}")
        for name in ("cores_per_rank", "train_cores"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        if not 0 <= self.writer_nice <= 19:
            raise ConfigError(f"writer_nice must be within 0..19, got {self.writer_nice}")

    def waiting_for_peers(self) -> HostModel:
        """This host for a CPU job whose ranks wait for each other at every step's collectives.

        Such a rank's waits are for its peers' CPU work, which their writers slow as much as its own: the waits
        stretch with the theft, and a writer that runs in them takes time the job needs. Below one core (or the
        rank's whole share, if less) ``train_cores`` buys nothing. Measured in ``bench/bench_fsdp.py`` (FSDP2, 2
        ranks on 2 cores, training busy 0.83–0.85 of its core): while each DCP-best save's extra 1.65–2.30
        CPU-seconds ran, the host's idle time did not shrink (−0.19 to −0.04 s per save over six runs), so all of it
        came out of the steps. A GPU job's waits are for the device, which the host's writers do not slow: its idle
        stays spare.
        """
        return replace(self, train_cores=max(self.train_cores, min(1.0, self.cores_per_rank)))

    @property
    def spare_cores(self) -> float:
        """Cores per rank training leaves idle: where a background writer runs for free."""
        return max(0.0, self.cores_per_rank - self.train_cores)


@dataclass(kw_only=True, slots=True, frozen=True)
class ModeCost:
    """One mode's predicted cost per save, for the largest rank (``plan --json``'s ``modes[mode]``)."""

    blocking_s: float
    """Seconds ``save()`` holds the training thread."""

    background_cpu_s: float
    """CPU seconds of the save's work after ``save()`` returns (copy thread, writer), on one core."""

    stolen_s: float
    """Training seconds that background work takes: its CPU that does not fit in the spare cores."""

    flush_s: float
    """``save()`` return → the bytes on the store: the slower of the store and the writer's CPU at its share."""

    step_inflation: float | None
    """Step time while the flush runs ÷ step time without one; None when training waits (synchronous)."""

    lost_per_save_s: float
    """Training time lost per save: blocking + stolen (+ waiting for the one slot when a flush runs past the next
    save)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True, slots=True, frozen=True)
class _Background:
    cpu_s: float
    nice: int
    serial: float | None = None
    """Share of the work done before any byte moves to the store (:func:`overlapped_write_s`)."""
    chunked: bool = False
    """Its serial share alternates with the device chunk by chunk (``O_DIRECT``), rather than coming first (a
    buffered file below the write-back threshold, serialized from the save's start and fsynced after). Only the
    latter lines up across ranks, which reach the save together: their writers' theft coincides and lockstep ranks
    lose it once (:func:`lockstep_delay` is for the rest: bursts that do not line up, as a paced writer's or
    ``O_DIRECT`` chunks' between device writes)."""


def predict_modes(
    *,
    bytes_per_rank: float,
    store_s: float,
    host: HostModel | None = None,
    costs: WriterCosts | None = None,
    interval_s: float | None = None,
    device_copy_s: float | None = None,
    direct_io: bool = True,
    dtensor_share: float = 0.0,
    dirty_background_bytes: float | None = None,
    lockstep_ranks: int = 1,
    writeback_store_s: float | None = None,
    paced_store_s: float | None = None,
    items_per_rank: int = 0,
) -> dict[str, ModeCost]:
    """Each of :data:`MODES`' cost per save for a rank writing ``bytes_per_rank`` whose bytes take ``store_s``
    to reach the store (all ranks writing at once), saving every ``interval_s`` seconds of compute (None: far
    enough apart that a flush never delays the next save).

    ``device_copy_s``: seconds to copy the rank's state off the accelerator (a DMA: it blocks, or for DCP-best
    overlaps, but costs the host's cores nothing); None for a CPU job, whose copies are memcpys at ``costs``.
    ``direct_io``: ckptio's writer writes with ``O_DIRECT`` (a durable POSIX tier: ``PosixStorage``'s default for
    large files with fsync on); False for a store it writes through the page cache or a socket.
    ``dtensor_share``: the share of the state's bytes held in DTensors (FSDP2 and tensor parallelism: 1) when
    default ``async_save`` is given a ``FileSystemWriter`` as ``storage_writer`` (the pattern of DCP's own
    example): it then stages with the writer's ``stage()``, ``_create_cpu_state_dict`` then ``_copy_state_dict``
    on every save (torch 2.13), and a CPU DTensor is deep-copied (two copies) and then copied into, three fresh
    copies of its bytes; a GPU DTensor is moved with ``.to("cpu")`` and then copied, the device copy and one
    fresh host copy. A plain tensor is copied once. Given only ``checkpoint_id=``, ``async_save`` stages with
    its ``DefaultStager``, one copy of every tensor: pass 0.
    ``dirty_background_bytes``: when the store is this host's own filesystem, the bytes of a rank's file the
    kernel leaves dirty in the page cache before it starts writing back (``vm.dirty_background_*`` ÷ the ranks
    on the host; :func:`ckptio.plan.measure.host.dirty_background_bytes`): see :func:`overlapped_write_s`. None: the
    store takes bytes as they are written (a parallel filesystem client's write-back, the demo's paced store).
    ``lockstep_ranks``: ranks that wait for each other at every step's collectives (the job's world size); see
    :func:`lockstep_delay`. 1: each rank's theft is charged once. Above 1 in a CPU job (``device_copy_s`` None),
    training's waits are no spare (:meth:`HostModel.waiting_for_peers`).
    ``writeback_store_s``: when the store is this host's disk, the seconds the same bytes take to reach it from
    the page cache (the kernel's write-back that a buffered writer's fsync waits for: DCP's files, ckptio's
    buffered path), which can be faster than the ``O_DIRECT`` writes ``store_s`` was measured with (one VM: 1.7–2.5
    GiB/s against 0.9–1.4). None: ``store_s`` for every writer.
    ``paced_store_s``: when the store is a budget on top of this host's disk that books each writer's bytes and
    holds the writer until its booking is up (the demo's and ``bench/bench_planner.py``'s emulated stores:
    ``ThrottledStorage``, ``ThrottledFileSystemWriter``), the seconds it books these bytes (all ranks); ``store_s``
    and ``writeback_store_s`` then say how fast the disk under it takes them, and each writer takes the longer of
    its booking and its real write. None: the store's time is its medium's.
    ``items_per_rank``: the entries of a rank's flattened state dict (with Adam, four per parameter: it, its two
    moments and their ``step``); DCP-best is charged :attr:`WriterCosts.dcp_items_per_s` for them. 0: bytes only.
    The demo and ``bench/bench_planner.py`` call this with their measured host and costs; ``plan`` with flags.
    """
    optional_times = (device_copy_s, writeback_store_s, paced_store_s)
    if bytes_per_rank < 0 or store_s < 0 or any(t is not None and not t >= 0 for t in optional_times):
        raise ConfigError(f"bytes and times must be >= 0, got {bytes_per_rank}, {store_s}, {device_copy_s}, "
                          f"{writeback_store_s} and {paced_store_s}")
    paced = paced_store_s or 0.0
    buffered_s = store_s if writeback_store_s is None else writeback_store_s
    if not 0.0 <= dtensor_share <= 1.0:
        raise ConfigError(f"dtensor_share must be within [0, 1], got {dtensor_share!r}")
    if dirty_background_bytes is not None and not dirty_background_bytes >= 0:
        raise ConfigError(f"dirty_background_bytes must be >= 0, got {dirty_background_bytes!r}")
    if not (isinstance(lockstep_ranks, int) and lockstep_ranks >= 1):
        raise ConfigError(f"lockstep_ranks must be an int >= 1, got {lockstep_ranks!r}")
    if not (isinstance(items_per_rank, int) and items_per_rank >= 0):
        raise ConfigError(f"items_per_rank must be an int >= 0, got {items_per_rank!r}")
    # Share of a buffered writer's bytes written before the kernel starts moving any to the store. ckptio's
    # O_DIRECT writes have no write-behind: each chunk reaches the device before the next is prepared.
    dcp_serial: float | None = None
    ckptio_serial: float | None = None
    if dirty_background_bytes is not None:
        dcp_serial = min(1.0, dirty_background_bytes / bytes_per_rank) if bytes_per_rank > 0 else 1.0
        ckptio_serial = 1.0 if direct_io else dcp_serial
    host = host or HostModel()
    if device_copy_s is None and lockstep_ranks > 1:
        host = host.waiting_for_peers()
    costs = costs or WriterCosts()
    b = float(bytes_per_rank)
    torch_save = b / costs.torch_save_bytes_per_s
    # CPU work on the training thread runs at the share of a core the host gives it; a DMA does not.
    slow = 1.0 / host.cpu_share
    copy = b / costs.copy_bytes_per_s * slow if device_copy_s is None else device_copy_s
    fresh_copy = b / costs.fresh_copy_bytes_per_s * slow
    dcp_staging = (1.0 + 2.0 * dtensor_share) * fresh_copy if device_copy_s is None \
        else device_copy_s + dtensor_share * fresh_copy
    staging_cpu = b / costs.copy_bytes_per_s if device_copy_s is None else 0.0
    write_rate = costs.direct_write_bytes_per_s if direct_io else costs.page_cache_bytes_per_s
    # The device's I/O costs the steps of every writer that moves these bytes to it while training runs, DCP's
    # write-back as much as ckptio's O_DIRECT writes (HostModel.direct_io_s_per_gib); dcp.save's lands while
    # training waits anyway.
    device_io = host.direct_io_s_per_gib * b / GIB if direct_io else 0.0
    dcp_io = device_io if host.buffered_io_s_per_gib is None else host.buffered_io_s_per_gib * b / GIB
    return {
        # Training waits: the write runs on the trainer's thread; the slower of it and the store sets the time.
        "dcp_sync": _sync((device_copy_s or 0.0)
                          + max(paced, overlapped_write_s(torch_save * slow, buffered_s, dcp_serial))),
        "dcp_async": _with_extra(_with_drag(_background(
            blocking_s=dcp_staging,
            work=_Background(cpu_s=torch_save, nice=0, serial=dcp_serial),
            store_s=buffered_s, paced_s=paced, host=host, interval_s=interval_s, ranks=lockstep_ranks,
        ), host.fresh_copy_drag), dcp_io),
        "dcp_best": _with_extra(_background(
            blocking_s=0.0,
            work=_Background(cpu_s=staging_cpu + torch_save + items_per_rank / costs.dcp_items_per_s, nice=0,
                             serial=dcp_serial),
            store_s=buffered_s, paced_s=paced, host=host, interval_s=interval_s, ranks=lockstep_ranks,
        ), dcp_io),
        "ckptio": _with_extra(_background(
            blocking_s=copy,
            work=_Background(cpu_s=b / costs.checksum_bytes_per_s + b / write_rate, nice=host.writer_nice,
                             serial=ckptio_serial, chunked=direct_io),
            store_s=store_s if direct_io else buffered_s, paced_s=paced, host=host, interval_s=interval_s,
            ranks=lockstep_ranks,
        ), device_io),
    }


def overlapped_write_s(cpu_s: float, store_s: float, serial: float | None) -> float:
    """Seconds a writer takes whose CPU work takes ``cpu_s`` and whose bytes take ``store_s`` to reach the store.

    ``serial``: the share of the work done before any byte moves. None or 0: the two overlap and the slower sets
    the time (a store that takes bytes as they come: a file's bytes go out while the next is prepared, a paced
    store sleeps out the rest). 1: one follows the other — a file written through the page cache and fsynced
    at the end, smaller than what the kernel lets sit dirty before writing back (``vm.dirty_background_ratio``,
    10 % of memory by default; otherwise only the 30 s expiry starts it), moves nothing until the fsync; an
    ``O_DIRECT`` writer sends each chunk before it prepares the next. In between, that share is serial and the
    rest overlaps.
    """
    if serial is None:
        return max(cpu_s, store_s)
    return serial * (cpu_s + store_s) + (1.0 - serial) * max(cpu_s, store_s)


def _sync(stall_s: float) -> ModeCost:
    return ModeCost(blocking_s=stall_s, background_cpu_s=0.0, stolen_s=0.0, flush_s=0.0, step_inflation=None,
                    lost_per_save_s=stall_s)


def writer_rate(host: HostModel, nice: int) -> tuple[float, float]:
    """(cores a one-thread background writer gets, the part of them taken from training).

    It gets the spare cores first (up to one: it is one thread), shared there only with the host's other load;
    on a core training also wants, the scheduler splits time by weight between the writer, training's thread and
    the other load (``1/cpu_share - 1`` nice-0 threads' worth).
    """
    spare = min(host.spare_cores, 1.0)
    weight = cfs_weight(nice)
    others = _NICE_0_WEIGHT * (1.0 / host.cpu_share - 1.0)
    contended = (1.0 - spare) * weight / (weight + _NICE_0_WEIGHT + others)
    return spare * weight / (weight + others) + contended, contended


def lockstep_delay(own_s: float, busy_s: float, flush_s: float, ranks: int) -> float:
    """Training time a rank loses to background work that robs it of ``own_s`` while busy ``busy_s`` of a
    ``flush_s`` flush, in a job of ``ranks`` that wait for each other at every step's collectives.

    A writer the store paces (``busy_s < flush_s``) runs in bursts, and the ranks' bursts do not line up: a rank
    waits for its own theft and, at the next collective, for every other rank's that did not coincide with it. With
    the bursts independent, the job is slowed over the union of the ranks' busy windows, ``1 - (1 - busy/flush)^ranks``
    of the flush, at the rate one burst robs a rank. A writer busy the whole flush (CPU-bound) robs every rank at once:
    ``own_s``, whatever the ranks. Measured: the demo's DCP-best, 0.44–0.49 s of run-queue wait per rank and
    0.19–0.21 s more waiting for the other rank (docs/planning.md).
    """
    if busy_s <= 0 or flush_s <= 0 or ranks <= 1:
        return own_s
    busy = min(1.0, busy_s / flush_s)
    return own_s * (1.0 - (1.0 - busy) ** ranks) / busy


def _with_drag(cost: ModeCost, drag: float) -> ModeCost:
    """``cost`` with training's own steps ``drag`` slower for as long as the flush keeps its fresh copy alive
    (:attr:`HostModel.fresh_copy_drag`): time the job loses on top of the writer's theft."""
    return _with_extra(cost, drag * cost.flush_s)


def _with_extra(cost: ModeCost, extra_s: float) -> ModeCost:
    """``cost`` with ``extra_s`` more training time lost while its flush runs, on top of the writer's theft."""
    if extra_s <= 0 or cost.flush_s <= 0:
        return cost
    stolen = cost.stolen_s + extra_s
    return replace(cost, stolen_s=stolen, step_inflation=1.0 + stolen / cost.flush_s,
                   lost_per_save_s=cost.lost_per_save_s + extra_s)


def _background(*, blocking_s: float, work: _Background, store_s: float, host: HostModel,
                interval_s: float | None, ranks: int = 1, paced_s: float = 0.0) -> ModeCost:
    rate, from_training = writer_rate(host, work.nice)
    # CPU the writer takes while training wants the core. Training's thread loses exactly that in wall time,
    # whatever the other load (it takes its slices from all runnable threads in proportion, and training's were
    # already its share); a training that spreads over several cores loses it spread over them.
    busy = work.cpu_s / rate  # the writer's wall time on its share of the cores
    stolen = work.cpu_s * from_training / rate
    flush = max(paced_s, overlapped_write_s(busy, store_s, work.serial))
    alone = stolen / max(1.0, host.train_cores)
    coincident = 0.0 if work.chunked else work.serial or 0.0
    delay = coincident * alone + (1.0 - coincident) * lockstep_delay(alone, busy, flush, ranks)
    wait = max(0.0, flush - interval_s) if interval_s is not None else 0.0
    inflation = 1.0 + delay / flush if flush > 0 else 1.0
    return ModeCost(blocking_s=blocking_s, background_cpu_s=work.cpu_s, stolen_s=delay, flush_s=flush,
                    step_inflation=inflation, lost_per_save_s=blocking_s + delay + wait)
