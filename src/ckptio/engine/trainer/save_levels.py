"""Where each save goes, and where a restore comes from: one level (durable only) or two (local, then durable).

The Checkpointer holds one of these as a collaborator, built by :func:`open_levels`:

* :class:`SingleLevel` (``durable_every=1``, the default): every save goes to the durable root, restore reads it.
  Its hooks do nothing, so a save is exactly what it is without levels.
* :class:`TwoLevels`: every save goes to the local level (this node's ``local_dir`` plus copies on ``replicas``
  partner nodes) and every ``durable_every``-th also to the durable root; restore takes the newest restorable step
  of either level from the fastest intact copies (``engine.restore.two_level_restore``); SIGTERM becomes an emergency
  save to the local level (a preemption hold of ``engine.process_hooks``: the first SIGTERM, and its duplicates
  within ``preempt_duplicate_window_s``, mark the rank preempted; a later one, or the grace period running out,
  ends the process as SIGTERM would).

At construction (every rank together) each rank of a two-level job binds its partner server's listening socket and
the side group exchanges each rank's :class:`~ckptio.engine.protocol.Peer` once; each writer inherits its socket and
learns every peer from :class:`~ckptio.engine.protocol.LevelsStart`. From then on the bytes move writer to writer: this
module never moves checkpoint bytes, and runs collectives only on the side group, from the training thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from ckptio.config import CheckpointerConfig
from ckptio.engine import process_hooks
from ckptio.engine.failure_markers import FailureMarkers
from ckptio.engine.partner import agree_secret
from ckptio.engine.protocol import JobLevels, LevelsStart, Peer
from ckptio.engine.restore.context import LocalLevel, ReadOptions, RestoreContext
from ckptio.engine.restore.step_restore import RestoreReport, restore_step
from ckptio.engine.restore.two_level_restore import TwoLevelRestore
from ckptio.engine.side_group import SideGroup
from ckptio.engine.trainer.save_handle import SaveHandle
from ckptio.errors import CkptError, ConfigError
from ckptio.format.local_level_records import local_records
from ckptio.obs.events import Event, EventLog
from ckptio.storage import Storage

log = logging.getLogger("ckptio")

def node_identity(node_id: str | None) -> str:
    """This rank's node: the override, else the host name (plus torchrun's GROUP_RANK, the node's index)."""
    if node_id:
        return node_id
    host = socket.gethostname()
    group_rank = os.environ.get("GROUP_RANK")
    return f"{host}#{group_rank}" if group_rank else host


def advertised_host() -> str:
    """The address partners reach this rank at, and the only one its partner server binds (never 0.0.0.0):
    ``CKPTIO_PARTNER_HOST`` (set it to the interface of the job's private network), else this host's address."""
    host = os.environ.get("CKPTIO_PARTNER_HOST")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def partner_ranks(peers: Sequence[Peer], rank: int, replicas: int) -> tuple[int, ...]:
    """The same local rank on the next ``replicas`` nodes (nodes ordered by their lowest rank)."""
    by_node: dict[str, list[int]] = {}
    for peer in sorted(peers, key=lambda p: p.rank):
        by_node.setdefault(peer.node, []).append(peer.rank)
    nodes = list(by_node)
    if replicas > len(nodes) - 1:
        raise ConfigError(f"replicas={replicas} needs {replicas + 1} nodes; this job has {len(nodes)} "
                          f"({', '.join(nodes)}): pass replicas={len(nodes) - 1} or node_id= per node")
    mine = next(peer.node for peer in peers if peer.rank == rank)
    n, i = nodes.index(mine), by_node[mine].index(rank)
    out = []
    for j in range(1, replicas + 1):
        ranks = by_node[nodes[(n + j) % len(nodes)]]
        out.append(ranks[i % len(ranks)])
    return tuple(out)


class SingleLevel:
    """Every save to the durable root; restore from it. The do-nothing base of :class:`TwoLevels`."""

    watch_preemption = False
    """Whether ``maybe_save`` agrees a SIGTERM across ranks (only a level that saves on SIGTERM needs to)."""
    emergency_level = "durable"
    """Where an emergency save goes."""

    def __init__(self, config: CheckpointerConfig, *, group: SideGroup, storage: Storage, local: Storage | None,
                 events: EventLog) -> None:
        self.config, self.group, self.storage, self.local, self.events = config, group, storage, local, events
        self.markers = FailureMarkers(storage)
        """Where a rank's failure or drop marker of a save goes (``engine.failure_markers``)."""

    def writer_start(self) -> LevelsStart | None:
        """What the writer needs to know of the levels (None: durable only)."""
        return None

    def job_levels(self, ordinal: int, *, emergency: bool) -> JobLevels:
        """The levels of the ``ordinal``-th save call (the same on every rank: every rank calls save together); an
        emergency save goes to ``emergency_level`` only."""
        return JobLevels()

    def preempted_at(self) -> float | None:
        """``time.monotonic()`` of the SIGTERM this rank received, if it acts on them."""
        return None

    def emergency_save(self, save: Callable[[int, dict[str, Any]], SaveHandle], step: int,
                       state: dict[str, Any]) -> SaveHandle:
        """Save ``step`` now through ``save`` (which submits an emergency save: to ``emergency_level``, unpaced),
        and wait at most ``preempt_grace_s`` (counted from the SIGTERM, if one came) for its commit. A save that did
        not commit in time is reported (event, log), never raised."""
        at = self.preempted_at()
        t0 = at if at is not None else time.monotonic()
        handle = save(step, state)
        with contextlib.suppress(CkptError, TimeoutError):
            handle.wait(max(0.0, t0 + self.config.preempt_grace_s - time.monotonic()))
        committed = handle.done() and handle.error is None and not handle.skipped
        self.events.emit(Event.PREEMPTED, step, committed=committed, seconds=time.monotonic() - t0,
                         level=self.emergency_level, error=str(handle.error) if handle.error else None)
        if not committed:
            log.warning("ckptio: emergency save of step %s did not commit within %.0f s: %s", step,
                        self.config.preempt_grace_s, handle.error or handle.skip_reason or "timed out")
        return handle

    def restore(self, state: dict[str, Any], step: int | None) -> RestoreReport:
        """Load the newest committed step (or ``step``) into ``state``: every rank together."""
        config = self.config
        options = ReadOptions.of(concurrency=config.upload_concurrency, trust_pickles=config.trust_pickles,
                                 safe_globals=config.safe_globals)
        return restore_step(RestoreContext(self.storage, self.group, local=self.local, options=options), state,
                            step=step)

    def close(self) -> None:
        """Undo what construction took (sockets, signal handlers)."""


class TwoLevels(SingleLevel):
    """The local level beside the durable one: partner placement, the ``durable_every`` schedule, SIGTERM."""

    watch_preemption = True
    emergency_level = "local"

    def __init__(self, config: CheckpointerConfig, *, group: SideGroup, storage: Storage, local: Storage | None,
                 events: EventLog) -> None:
        super().__init__(config, group=group, storage=storage, local=local, events=events)
        if local is None or local.local_directory() is None:
            raise ConfigError("durable_every > 1 needs a POSIX local_dir (the local level)")
        self.records = local_records(storage)
        self.markers = FailureMarkers(storage, self.records)
        secret = agree_secret(group)  # every rank together, before any writer exists: it authenticates partners
        host = advertised_host()
        self.listener = socket.create_server((host, 0), backlog=128)
        try:
            me = (group.rank, node_identity(config.node_id), host, self.listener.getsockname()[1])
            peers = tuple(sorted((Peer(*p) for p in group.broadcast_from_rank0(group.gather_to_rank0(me))),
                                 key=lambda p: p.rank))
            self.start = LevelsStart(node=me[1], listen_fd=self.listener.fileno(), peers=peers,
                                     partner_ranks=partner_ranks(peers, group.rank, config.replicas),
                                     timeout_s=config.partner_timeout_s, secret=secret)
        except BaseException:
            self.listener.close()
            raise
        self.preemption: process_hooks.PreemptionHold | None = None
        if config.preempt_grace_s > 0:  # None off the main thread: SIGTERM is then left as it is
            self.preemption = process_hooks.hold_sigterm(config.preempt_grace_s, config.preempt_duplicate_window_s)
        self.watch_preemption = self.preemption is not None

    def writer_start(self) -> LevelsStart | None:
        return self.start

    def job_levels(self, ordinal: int, *, emergency: bool) -> JobLevels:
        if emergency:
            return JobLevels(durable=False, local=True)
        return JobLevels(durable=ordinal % self.config.durable_every == 0, local=True)

    def preempted_at(self) -> float | None:
        return self.preemption.at if self.preemption is not None else None

    def restore(self, state: dict[str, Any], step: int | None) -> RestoreReport:
        """The newest restorable step on either level, each file from its fastest intact copy."""
        config, start = self.config, self.start
        options = ReadOptions.of(concurrency=config.upload_concurrency, trust_pickles=config.trust_pickles,
                                 safe_globals=config.safe_globals)
        level = LocalLevel(self.records, start.node, start.peers, start.secret, config.partner_timeout_s)
        ctx = RestoreContext(self.storage, self.group, local=self.local, options=options, level=level)
        report = TwoLevelRestore(ctx).run(state, step)
        self.events.emit(Event.RESTORED, report.step, level=report.level, sources=report.sources, note=report.note,
                         seconds=report.seconds)
        return report

    def emergency_save(self, save: Callable[[int, dict[str, Any]], SaveHandle], step: int,
                       state: dict[str, Any]) -> SaveHandle:
        try:
            return super().emergency_save(save, step, state)
        finally:
            if self.preemption is not None:
                self.preemption.done()

    def close(self) -> None:
        if self.preemption is not None:
            self.preemption.release()
        self.listener.close()


def open_levels(config: CheckpointerConfig, *, group: SideGroup, storage: Storage, local: Storage | None,
                events: EventLog) -> SingleLevel:
    """The levels of ``config``: every rank calls it together (a two-level job exchanges partner addresses)."""
    kind = SingleLevel if config.durable_every == 1 else TwoLevels
    return kind(config, group=group, storage=storage, local=local, events=events)
