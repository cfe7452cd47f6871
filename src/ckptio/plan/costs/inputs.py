"""The inputs of the background-cost model (:func:`ckptio.plan.costs.background.predict_modes`), each a small frozen
value documented once: what a rank saves and how often (:class:`Workload`), how its bytes meet the store
(:class:`StoreTiming`), the host the rank runs on (:class:`Host`), and what each piece of a save's work costs a core
(:class:`WriterCosts`); and the network between the ranks (:class:`Network`), which the restore model
(:mod:`ckptio.plan.costs.readback`) and the partner copies of the two-level model cross.

Owns their meaning and their validation. It must never measure: :mod:`ckptio.plan.measure` produces these values on
a real host and store (the figures they have read, host by host, are in docs/planning-measurements.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from ckptio.errors import ConfigError

GIB = float(1 << 30)
"""Bytes in a GiB: the unit of :attr:`Host.direct_io_s_per_gib`."""

CKPTIO_WRITER_NICE = 10
"""ckptio's default ``writer_nice`` (:class:`ckptio.config.CheckpointerConfig`)."""

DEFAULT_NETWORK_BYTES_PER_S = 25e9
"""One node's network bandwidth, each direction: one 200 Gb/s NIC (InfiniBand HDR, 200 GbE)."""

DEFAULT_RANKS_PER_NODE = 8
"""Ranks on one node: a node of eight GPUs."""


def _share(name: str, value: object) -> None:
    """Refuse a share that is not a number within [0, 1]."""
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ConfigError(f"{name} must be within [0, 1], got {value!r}")


def _at_least_zero(owner: str, name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    # `not value >= 0` also refuses NaN, which every comparison below would otherwise let through.
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 and math.isfinite(value)):
        raise ConfigError(f"{owner} {name} must be a finite number >= 0, got {value!r}")


@dataclass(kw_only=True, slots=True, frozen=True)
class Workload:
    """What one rank saves and how often, as the background-cost model sees it."""

    bytes_per_rank: float
    """Bytes the rank saves: the largest rank's, since ranks that wait for each other wait for it."""

    interval_s: float | None = None
    """Seconds of compute between saves; None: far enough apart that a flush never delays the next save."""

    device_copy_s: float | None = None
    """Seconds to copy the rank's state off the accelerator: a DMA, which blocks (or for DCP-best overlaps) but costs
    the host's cores nothing. None for a CPU job, whose copies are memcpys at :class:`WriterCosts`' rates."""

    overlap_s: float | None = None
    """Seconds of training a device copy launched on a side stream runs beside before the state is first mutated:
    the next step's forward and backward. ckptio (``save()`` enqueues the copy into a pinned slot on a side CUDA
    stream; its guard orders only the optimizer step after it) and DCP-best (``staging_completion`` awaited before
    ``optimizer.step``) wait for what remains of the copy after them. None: unknown, the whole copy is charged."""

    dtensor_share: float = 0.0
    """Share of the state's bytes held in DTensors (FSDP2 and tensor parallelism: 1) when default ``async_save`` is
    given a ``FileSystemWriter`` as ``storage_writer`` (the pattern of DCP's own example). It then stages with the
    writer's ``stage()``, ``_create_cpu_state_dict`` then ``_copy_state_dict`` on every save (torch 2.13): a CPU
    DTensor is deep-copied (two copies) and then copied into, three fresh copies of its bytes; a GPU DTensor is moved
    with ``.to("cpu")`` and then copied, the device copy and one fresh host copy. A plain tensor is copied once. Given
    only ``checkpoint_id=``, ``async_save`` stages with its ``DefaultStager``, one copy of every tensor: pass 0."""

    lockstep_ranks: int = 1
    """Ranks that wait for each other at every step's collectives (the job's world size; see
    :func:`~ckptio.plan.costs.background.lockstep_delay`). 1: each rank's theft is charged once. Above 1 in a CPU job
    (``device_copy_s`` None), training's waits are no spare (:meth:`Host.waiting_for_peers`)."""

    items_per_rank: int = 0
    """Entries of the rank's flattened state dict (with Adam, four per parameter: it, its two moments and their
    ``step``); DCP-best is charged :attr:`WriterCosts.dcp_items_per_s` for them. 0: bytes only."""

    nic_share: float = 0.0
    """Share of a step the node's NIC is busy with training's own collectives, where the save's bytes leave the
    node through that NIC (:meth:`Network.collective_share`); 0 where they leave another way."""

    nic_bytes_per_s: float | None = None
    """The NIC's bandwidth, one direction, per rank of the node (the rank's share of it); None with ``nic_share`` 0."""

    def __post_init__(self) -> None:
        _at_least_zero("workload", "bytes_per_rank", self.bytes_per_rank)
        for name in ("interval_s", "device_copy_s", "overlap_s", "nic_bytes_per_s"):
            _at_least_zero("workload", name, getattr(self, name), optional=True)
        _share("nic_share", self.nic_share)
        if self.nic_share > 0 and not self.nic_bytes_per_s:
            raise ConfigError("a workload with a nic_share needs the NIC's nic_bytes_per_s")
        _share("dtensor_share", self.dtensor_share)
        if not (isinstance(self.lockstep_ranks, int) and self.lockstep_ranks >= 1):
            raise ConfigError(f"lockstep_ranks must be an int >= 1, got {self.lockstep_ranks!r}")
        if not (isinstance(self.items_per_rank, int) and self.items_per_rank >= 0):
            raise ConfigError(f"items_per_rank must be an int >= 0, got {self.items_per_rank!r}")


@dataclass(kw_only=True, slots=True, frozen=True)
class StoreTiming:
    """How one save's bytes meet the store, every rank writing at once."""

    store_s: float
    """Seconds the rank's bytes take to reach the store, all ranks writing at once: the store's own part of the
    flush (the writers' CPU is the model's to place)."""

    direct_io: bool = True
    """ckptio's writer writes with ``O_DIRECT`` (a durable POSIX tier: ``PosixStorage``'s default for large files
    with fsync on); False for a store it writes through the page cache or a socket."""

    writeback_store_s: float | None = None
    """When the store is this host's disk: the seconds the same bytes take to reach it from the page cache (the
    kernel's write-back that a buffered writer's fsync waits for: DCP's files, ckptio's buffered path), which can be
    faster than the ``O_DIRECT`` writes ``store_s`` was measured with. None: ``store_s`` for every writer."""

    paced_store_s: float | None = None
    """When the store is a budget on top of this host's disk that books each writer's bytes and holds the writer
    until its booking is up (the demo's and ``bench/bench_planner.py``'s emulated stores: ``ThrottledStorage``,
    ``ThrottledFileSystemWriter``): the seconds it books these bytes (all ranks). ``store_s`` and
    ``writeback_store_s`` then say how fast the disk under it takes them, and each writer takes the longer of its
    booking and its real write. None: the store's time is its medium's."""

    dirty_background_bytes: float | None = None
    """When the store is this host's own filesystem: the bytes of a rank's file the kernel leaves dirty in the page
    cache before it starts writing back (``vm.dirty_background_*`` ÷ the ranks on the host), so a smaller buffered
    file moves nothing before its fsync (:func:`~ckptio.plan.costs.background.overlapped_write_s`). None: the store
    takes bytes as they are written (a parallel filesystem client's write-back, the demo's paced store)."""

    def __post_init__(self) -> None:
        _at_least_zero("store", "store_s", self.store_s)
        for name in ("writeback_store_s", "paced_store_s", "dirty_background_bytes"):
            _at_least_zero("store", name, getattr(self, name), optional=True)

    @property
    def buffered_s(self) -> float:
        """Seconds a buffered writer's bytes take to reach the store."""
        return self.store_s if self.writeback_store_s is None else self.writeback_store_s


@dataclass(kw_only=True, slots=True, frozen=True)
class WriterCosts:
    """Bytes per CPU-second of one core, per piece of work a save does
    (:func:`ckptio.plan.measure.writer_costs.measure_writer_costs`); DCP-best's per-entry work is counted in state
    entries (:attr:`dcp_items_per_s`).

    The defaults are one small 2-core cloud VM's (docs/planning-measurements.md); give the figures of the host the job
    runs on when they matter.
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
    """``O_DIRECT`` write of new bytes through ckptio's bounce buffer (``ckptio.storage.posix.direct_io``): the bounce
    copy and the system calls; the device moves the bytes by DMA."""

    dcp_items_per_s: float = 2000.0
    """State items (tensors, other values), not bytes, per CPU-second: what DCP-best's saves spend per item beyond
    its bytes (planning and metadata, and the pipe that hands the staged shared-memory state dict to the checkpoint
    process, each storage's file descriptor passed on its own). Not probed: the default is a measurement of the
    trainer and the checkpoint process together (docs/planning-measurements.md)."""

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
class Host:
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
    one ÷ without, − 1 (:func:`ckptio.plan.measure.training.measure_fresh_copy_drag` measures it). Default
    ``async_save`` stages into new memory and keeps it until its write is done; in a CPU job whose steps allocate and
    free large host buffers (gradients, FSDP's all-gathered parameters), that copy takes the memory glibc's heap was
    recycling for them, the buffers land above it and are trimmed back to the kernel at every free, and every step
    faults them in again until the copy is freed (a heap that is never trimmed does not pay it). A GPU job keeps those
    buffers on the device: 0."""

    direct_io_s_per_gib: float = 0.0
    """Training seconds the job loses per GiB a rank's writer moves to the store's device while training runs,
    beyond what the model charges from CPU costs (a save's staging copy and its writer's CPU). Named for ckptio's
    ``O_DIRECT`` writer, through which it is measured: :func:`~ckptio.plan.costs.calibration.excess_from_trial`
    takes it from a trial save of ckptio's own writer on the job's ranks and store
    (:func:`ckptio.plan.measure.training.measure_save_loss`), every rank saving at once, so the figure is already the
    job's, lockstep included. Why a device's I/O costs the cores: on a VM the hypervisor emulates the disk and its
    interrupts on the vCPUs training runs on (a kernel without ``CONFIG_IRQ_TIME_ACCOUNTING`` charges interrupt time
    to whichever task they interrupt, and the host's steal grows), and a save's cost outlives its durability by a few
    steps; on other hosts it is 0. The background DCP modes are charged it too (not ``dcp.save``, whose I/O lands
    while training waits for it): their write-back moves the same bytes to the same device. Not charged where ckptio
    writes without ``O_DIRECT`` (``StoreTiming.direct_io`` False: a tmpfs, a socket), where no trial measures it.
    Where a trial of a buffered writer measures the DCP modes' own figure (:attr:`buffered_io_s_per_gib`), they are
    charged that instead."""

    buffered_io_s_per_gib: float | None = None
    """As :attr:`direct_io_s_per_gib`, for DCP's background writers (``torch.save`` through the page cache, fsync,
    at the trainer's priority): what they cost the steps per GiB beyond the model's CPU charge, taken by
    :func:`~ckptio.plan.costs.calibration.excess_from_trial` from a trial save of DCP-best on the job's ranks and
    store, charged to default ``async_save`` and DCP-best. None: no such trial; they are charged
    :attr:`direct_io_s_per_gib`. Why a trial of their own: ckptio's ``O_DIRECT`` trial measures a different writer's
    I/O, and what a VM makes of a buffered one (its page-cache pages' first touch, the write-back's interrupts, the
    ranks' bursts drifting apart) is not what it makes of ``O_DIRECT``. bench_planner runs it."""

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

    def waiting_for_peers(self) -> Host:
        """This host for a CPU job whose ranks wait for each other at every step's collectives.

        Such a rank's waits are for its peers' CPU work, which their writers slow as much as its own: the waits
        stretch with the theft, and a writer that runs in them takes time the job needs. Below one core (or the
        rank's whole share, if less) ``train_cores`` buys nothing: the host's idle time does not shrink while such a
        writer runs, so all of its CPU comes out of the steps (bench_fsdp's evidence is in
        docs/planning-measurements.md). A GPU job's waits are for the device, which the host's writers do not slow:
        its idle stays spare.
        """
        return replace(self, train_cores=max(self.train_cores, min(1.0, self.cores_per_rank)))

    @property
    def spare_cores(self) -> float:
        """Cores per rank training leaves idle: where a background writer runs for free."""
        return max(0.0, self.cores_per_rank - self.train_cores)


@dataclass(kw_only=True, slots=True, frozen=True)
class Network:
    """The network between nodes, as the restore's exchange and the partner copies see it.

    A restore reads each stored byte once and sends it to the other ranks that need it over ckptio's gloo side
    group (TCP); the ranks of a node share its NIC, each direction on its own (full duplex). Traffic between two
    ranks of one node is counted as if it crossed the NIC too, which a job whose replicas sit on other nodes (data
    parallel across nodes, the usual layout) is close to."""

    bytes_per_s: float = DEFAULT_NETWORK_BYTES_PER_S
    """One node's bandwidth, each direction (``--network-bandwidth``)."""

    ranks_per_node: int = DEFAULT_RANKS_PER_NODE
    """Ranks sharing one node's NIC (``--ranks-per-node``)."""

    collective_bytes_per_step: float = 0.0
    """Bytes one rank's collectives send per training step through this NIC, where the store's traffic leaves the
    node through it too (``--collective-bytes``; a ring all-reduce of G gradient bytes over N ranks sends
    2·(N−1)/N·G). 0: the store is reached over another network (a separate storage NIC, a GPU fabric for the
    collectives), or the steps send nothing; the save's bytes then cost training no network time."""

    def __post_init__(self) -> None:
        if not (isinstance(self.bytes_per_s, (int, float)) and math.isfinite(self.bytes_per_s)
                and self.bytes_per_s > 0):
            raise ConfigError(f"network bytes_per_s must be a positive number, got {self.bytes_per_s!r}")
        if not (isinstance(self.ranks_per_node, int) and self.ranks_per_node >= 1):
            raise ConfigError(f"ranks per node must be an integer >= 1, got {self.ranks_per_node!r}")
        if not (isinstance(self.collective_bytes_per_step, (int, float))
                and math.isfinite(self.collective_bytes_per_step) and self.collective_bytes_per_step >= 0):
            raise ConfigError(f"collective bytes per step must be a finite number >= 0, got "
                              f"{self.collective_bytes_per_step!r}")

    def collective_share(self, step_time_s: float | None) -> float:
        """Share of a ``step_time_s`` step the NIC spends sending the node's collectives (0 when the step time is
        unknown or nothing is sent; at most 1: a step the network bounds)."""
        if not step_time_s or self.collective_bytes_per_step <= 0:
            return 0.0
        return min(1.0, self.ranks_per_node * self.collective_bytes_per_step / (self.bytes_per_s * step_time_s))
