"""What a save costs the training step, per save mode: the blocking part, and the CPU the background writer takes.

Owns the background-cost model of the planner (its derivation is in docs/planning.md, "What a save costs the
step"): from what a rank saves (:class:`~ckptio.plan.costs.inputs.Workload`), how its bytes meet the store
(:class:`~ckptio.plan.costs.inputs.StoreTiming`), the host's cores and training's own CPU use
(:class:`~ckptio.plan.costs.inputs.Host`) and the per-byte CPU costs of each piece of work a save does
(:class:`~ckptio.plan.costs.inputs.WriterCosts`), it predicts for each of :data:`MODES` the time ``save()`` blocks,
the CPU the rest of the save takes while training goes on, how much of that CPU comes out of training's share of the
cores, the step inflation while the flush runs, and the training time lost per save. It must never measure anything
(:mod:`ckptio.plan.measure` does) and never touch storage: the store's part arrives as
:attr:`~ckptio.plan.costs.inputs.StoreTiming.store_s` (the budget computes it from the store's limits).

The modes:

* ``dcp_sync`` — ``torch.distributed.checkpoint.save``: training waits for the whole write.
* ``dcp_async`` — default ``dcp.async_save``: a blocking copy into freshly allocated memory (three of them for a
  CPU DTensor: see :attr:`~ckptio.plan.costs.inputs.Workload.dtensor_share`), then a thread of the training
  process writes with ``torch.save`` (zip CRC on) and fsyncs each file, at the trainer's priority; while that copy
  lives, a CPU job's own steps may run slower (:attr:`~ckptio.plan.costs.inputs.Host.fresh_copy_drag`).
* ``dcp_best`` — ``dcp.async_save`` with a PROCESS checkpointer and a ``DefaultStager`` (async staging into cached
  shared memory): the copy runs in a staging thread of the training process, the write in a separate process,
  both at the trainer's priority; ``save()`` itself blocks for next to nothing.
* ``ckptio`` — the copy into a reused shared-memory slot runs on a staging thread; a writer process at
  ``writer_nice`` checksums (crc32c) and writes the slot's bytes, with ``O_DIRECT`` through a small bounce buffer on
  a durable POSIX tier (no page-cache allocation), through the page cache or a socket elsewhere.

A state on an accelerator (:attr:`~ckptio.plan.costs.inputs.Workload.device_copy_s`) ckptio and DCP-best stage
alike: the copy goes on a side CUDA stream into pinned memory and runs beside the next forward and backward;
``save()`` returns at once and only the optimizer step waits, for what remains of the copy after them
(:attr:`~ckptio.plan.costs.inputs.Workload.overlap_s`; ``ModeCost.staging_wait_s``). Default ``async_save`` blocks
for its copy, and ``dcp.save`` for everything.

On a durable POSIX tier the device's I/O may cost the steps more than the writers' CPU: every background mode is
charged :attr:`~ckptio.plan.costs.inputs.Host.direct_io_s_per_gib` for its bytes (DCP's,
:attr:`~ckptio.plan.costs.inputs.Host.buffered_io_s_per_gib` where a trial of their own writer measured it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

from ckptio.plan.costs.inputs import GIB, Host, StoreTiming, Workload, WriterCosts

MODES = ("dcp_sync", "dcp_async", "dcp_best", "ckptio")
"""Save modes the planner predicts, in the order tables print them."""

_NICE_0_WEIGHT = 1024.0
"""Linux CFS weight of a nice-0 task; each nice level divides it by about 1.25 (``sched_prio_to_weight``)."""


def cfs_weight(nice: int) -> float:
    """The scheduler weight of a task at ``nice`` (CFS: 1024 at 0, ÷1.25 per level)."""
    return _NICE_0_WEIGHT / 1.25**nice


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
    """Training time lost per save: blocking + staging wait + stolen (+ waiting for the one slot when a flush runs
    past the next save)."""

    staging_wait_s: float = 0.0
    """Seconds training waits, after ``save()`` returned, for a device copy to end before its first mutation: what
    remains of a side-stream copy after the next forward and backward (ckptio, DCP-best; 0 off a device)."""

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


def predict_modes(workload: Workload, store: StoreTiming, *, host: Host | None = None,
                  costs: WriterCosts | None = None) -> dict[str, ModeCost]:
    """Each of :data:`MODES`' cost per save of ``workload`` on ``store``, on ``host`` (default :class:`Host`) at
    ``costs`` (default :class:`WriterCosts`); each input is documented on its class (:mod:`ckptio.plan.costs.inputs`).
    The demo and ``bench/bench_planner.py`` call this with their measured host and costs; ``plan`` with flags."""
    # Share of a buffered writer's bytes written before the kernel starts moving any to the store. ckptio's
    # O_DIRECT writes have no write-behind: each chunk reaches the device before the next is prepared.
    b = float(workload.bytes_per_rank)
    dcp_serial: float | None = None
    ckptio_serial: float | None = None
    if store.dirty_background_bytes is not None:
        dcp_serial = min(1.0, store.dirty_background_bytes / b) if b > 0 else 1.0
        ckptio_serial = 1.0 if store.direct_io else dcp_serial
    host = host or Host()
    if workload.device_copy_s is None and workload.lockstep_ranks > 1:
        host = host.waiting_for_peers()
    costs = costs or WriterCosts()
    device_copy_s, interval_s, ranks = workload.device_copy_s, workload.interval_s, workload.lockstep_ranks
    paced, buffered_s = store.paced_store_s or 0.0, store.buffered_s
    torch_save = b / costs.torch_save_bytes_per_s
    # CPU work on the training thread runs at the share of a core the host gives it; a DMA does not.
    slow = 1.0 / host.cpu_share
    copy = b / costs.copy_bytes_per_s * slow if device_copy_s is None else device_copy_s
    fresh_copy = b / costs.fresh_copy_bytes_per_s * slow
    dcp_staging = (1.0 + 2.0 * workload.dtensor_share) * fresh_copy if device_copy_s is None \
        else device_copy_s + workload.dtensor_share * fresh_copy
    staging_cpu = b / costs.copy_bytes_per_s if device_copy_s is None else 0.0
    # A device copy on a side stream into a pinned slot (ckptio's stager; DCP-best's stager) runs beside the next
    # forward and backward: save() returns at once and the optimizer step waits for what remains of the copy.
    side_wait = 0.0 if device_copy_s is None else max(0.0, device_copy_s - (workload.overlap_s or 0.0))
    write_rate = costs.direct_write_bytes_per_s if store.direct_io else costs.page_cache_bytes_per_s
    # The device's I/O costs the steps of every writer that moves these bytes to it while training runs, DCP's
    # write-back as much as ckptio's O_DIRECT writes (Host.direct_io_s_per_gib); dcp.save's lands while training
    # waits anyway.
    device_io = host.direct_io_s_per_gib * b / GIB if store.direct_io else 0.0
    dcp_io = device_io if host.buffered_io_s_per_gib is None else host.buffered_io_s_per_gib * b / GIB
    background = {
        # Training waits: the write runs on the trainer's thread; the slower of it and the store sets the time.
        "dcp_sync": _sync((device_copy_s or 0.0)
                          + max(paced, overlapped_write_s(torch_save * slow, buffered_s, dcp_serial))),
        "dcp_async": _with_extra(_with_drag(_background(
            blocking_s=dcp_staging,
            work=_Background(cpu_s=torch_save, nice=0, serial=dcp_serial),
            store_s=buffered_s, paced_s=paced, host=host, interval_s=interval_s, ranks=ranks,
        ), host.fresh_copy_drag), dcp_io),
        "dcp_best": _with_wait(_with_extra(_background(
            blocking_s=0.0,
            work=_Background(cpu_s=staging_cpu + torch_save + workload.items_per_rank / costs.dcp_items_per_s,
                             nice=0, serial=dcp_serial),
            store_s=buffered_s, paced_s=paced, host=host, interval_s=interval_s, ranks=ranks,
        ), dcp_io), side_wait),
        "ckptio": _with_wait(_with_extra(_background(
            blocking_s=copy if device_copy_s is None else 0.0,
            work=_Background(cpu_s=b / costs.checksum_bytes_per_s + b / write_rate, nice=host.writer_nice,
                             serial=ckptio_serial, chunked=store.direct_io),
            store_s=store.store_s if store.direct_io else buffered_s, paced_s=paced, host=host,
            interval_s=interval_s, ranks=ranks,
        ), device_io), side_wait),
    }
    # dcp.save's bytes cross the NIC while training waits anyway: only the background modes meet the collectives.
    return {name: cost if name == "dcp_sync" else _with_extra(cost, nic_delay_s(workload, cost.flush_s))
            for name, cost in background.items()}


def nic_delay_s(workload: Workload, flush_s: float) -> float:
    """Training time lost per save to the save's bytes crossing the node's NIC while the collectives use it.

    Where the network bounds the steps (``nic_share`` 1), every byte of the save that leaves the node delays the
    collectives by the time that byte takes on the NIC, however the NIC shares itself between the flows: the bytes
    of both must cross it, one after the other. Where the collectives leave the NIC idle part of each step, the
    save's bytes fill those gaps first and meet the collectives' for ``nic_share`` of their time. Only the part of the
    flush while training runs counts: a flush longer than the interval has training waiting for the slot (sending
    nothing) for the rest.
    """
    if workload.nic_share <= 0 or not workload.nic_bytes_per_s or flush_s <= 0:
        return 0.0
    training = 1.0 if workload.interval_s is None else min(1.0, workload.interval_s / flush_s)
    return workload.nic_share * workload.bytes_per_rank / workload.nic_bytes_per_s * training


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


class WriterShare(NamedTuple):
    """The cores a one-thread background writer gets (:func:`writer_rate`)."""

    cores: float
    """Cores it runs on, spare and contended together."""
    from_training: float
    """The part of them taken from training."""


def writer_rate(host: Host, nice: int) -> WriterShare:
    """The cores a one-thread background writer at ``nice`` gets on ``host``, and the part taken from training.

    It gets the spare cores first (up to one: it is one thread), shared there only with the host's other load;
    on a core training also wants, the scheduler splits time by weight between the writer, training's thread and
    the other load (``1/cpu_share - 1`` nice-0 threads' worth).
    """
    spare = min(host.spare_cores, 1.0)
    weight = cfs_weight(nice)
    others = _NICE_0_WEIGHT * (1.0 / host.cpu_share - 1.0)
    contended = (1.0 - spare) * weight / (weight + _NICE_0_WEIGHT + others)
    return WriterShare(cores=spare * weight / (weight + others) + contended, from_training=contended)


def lockstep_delay(own_s: float, busy_s: float, flush_s: float, ranks: int) -> float:
    """Training time a rank loses to background work that robs it of ``own_s`` while busy ``busy_s`` of a
    ``flush_s`` flush, in a job of ``ranks`` that wait for each other at every step's collectives.

    A writer the store paces (``busy_s < flush_s``) runs in bursts, and the ranks' bursts do not line up: a rank
    waits for its own theft and, at the next collective, for every other rank's that did not coincide with it. With
    the bursts independent, the job is slowed over the union of the ranks' busy windows, ``1 - (1 - busy/flush)^ranks``
    of the flush, at the rate one burst robs a rank. A writer busy the whole flush (CPU-bound) robs every rank at once:
    ``own_s``, whatever the ranks. The demo's measurement of both parts is in docs/planning-measurements.md.
    """
    if busy_s <= 0 or flush_s <= 0 or ranks <= 1:
        return own_s
    busy = min(1.0, busy_s / flush_s)
    return own_s * (1.0 - (1.0 - busy) ** ranks) / busy


def _with_drag(cost: ModeCost, drag: float) -> ModeCost:
    """``cost`` with training's own steps ``drag`` slower for as long as the flush keeps its fresh copy alive
    (:attr:`Host.fresh_copy_drag`): time the job loses on top of the writer's theft."""
    return _with_extra(cost, drag * cost.flush_s)


def _with_wait(cost: ModeCost, wait_s: float) -> ModeCost:
    """``cost`` with training waiting ``wait_s`` for its staging copy before the first mutation."""
    return replace(cost, staging_wait_s=wait_s, lost_per_save_s=cost.lost_per_save_s + wait_s) if wait_s > 0 \
        else cost


def _with_extra(cost: ModeCost, extra_s: float) -> ModeCost:
    """``cost`` with ``extra_s`` more training time lost while its flush runs, on top of the writer's theft."""
    if extra_s <= 0 or cost.flush_s <= 0:
        return cost
    stolen = cost.stolen_s + extra_s
    return replace(cost, stolen_s=stolen, step_inflation=1.0 + stolen / cost.flush_s,
                   lost_per_save_s=cost.lost_per_save_s + extra_s)


def _background(*, blocking_s: float, work: _Background, store_s: float, host: Host,
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
