"""Two levels on the training thread (issue 10): node identity, partner placement, the durable_every schedule,
emergency saves and SIGTERM preemption, and the restore entry point.

At construction (every rank together), each rank binds its partner server's listening socket, and the side group
exchanges ``(node, host, port)`` once; each writer inherits its socket and learns every peer from
:class:`~ckptio.engine.protocol.LevelsStart`. From then on the bytes move writer to writer over TCP: this module
never moves checkpoint bytes and runs collectives only on the side group, from the training thread.

``Checkpointer`` mixes :class:`TwoLevels` in; with ``durable_every=1`` (the default) ``_levels`` is None and every
hook here is a no-op, so a save is exactly what it was without levels.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptio.engine.handle import SaveHandle
from ckptio.engine.protocol import LevelsStart
from ckptio.errors import CkptError, ConfigError
from ckptio.obs.events import Event

if TYPE_CHECKING:
    from ckptio.config import CheckpointerConfig
    from ckptio.engine.group import SideGroup
    from ckptio.obs.events import EventLog
    from ckptio.storage import Storage

log = logging.getLogger("ckptio")


def node_identity(node_id: str | None) -> str:
    """This rank's node: the override, else the host name (plus torchrun's GROUP_RANK, the node's index)."""
    if node_id:
        return node_id
    host = socket.gethostname()
    group_rank = os.environ.get("GROUP_RANK")
    return f"{host}#{group_rank}" if group_rank else host


def _advertised_host() -> str:
    """The address partners reach this rank at, and the only one its partner server binds (never 0.0.0.0):
    ``CKPTIO_PARTNER_HOST`` (set it to the interface of the job's private network), else this host's address."""
    host = os.environ.get("CKPTIO_PARTNER_HOST")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def partner_ranks(peers: list[tuple[int, str, str, int]], rank: int, replicas: int) -> tuple[int, ...]:
    """The same local rank on the next ``replicas`` nodes (nodes ordered by their lowest rank)."""
    by_node: dict[str, list[int]] = {}
    for r, node, _, _ in sorted(peers):
        by_node.setdefault(node, []).append(r)
    nodes = list(by_node)
    if replicas > len(nodes) - 1:
        raise ConfigError(f"replicas={replicas} needs {replicas + 1} nodes; this job has {len(nodes)} "
                          f"({', '.join(nodes)}): pass replicas={len(nodes) - 1} or node_id= per node")
    mine = next(node for r, node, _, _ in peers if r == rank)
    n, i = nodes.index(mine), by_node[mine].index(rank)
    out = []
    for j in range(1, replicas + 1):
        ranks = by_node[nodes[(n + j) % len(nodes)]]
        out.append(ranks[i % len(ranks)])
    return tuple(out)


@dataclass
class LevelsRuntime:
    """The trainer's state of the local level."""

    start: LevelsStart
    listener: socket.socket
    local_saves: int = 0
    emergency: bool = False
    preempted_at: float | None = None
    previous_handler: Any = None


class TwoLevels:
    """The Checkpointer's two-level methods (mixed in: checkpointer.py keeps only the hooks)."""

    _levels: LevelsRuntime | None = None
    last_restore: dict[str, Any] | None = None
    """What the last ``restore`` read: ``{"step", "level", "sources": {"local"|"partner"|"durable": files}}``."""

    if TYPE_CHECKING:
        config: CheckpointerConfig
        group: SideGroup
        rank: int
        world_size: int
        storage: Storage
        local: Storage | None
        events: EventLog
        _resources: contextlib.ExitStack

        def save(self, step: int, state: dict[str, Any]) -> SaveHandle: ...

        def close(self, *, wait: bool = True) -> None: ...

    # ---- construction (every rank together) ------------------------------------------------------------------
    def _setup_levels(self) -> None:
        config = self.config
        if config.durable_every == 1:
            return
        if self.local is None or not self.local.is_posix:
            raise ConfigError("durable_every > 1 needs a POSIX local_dir (the local level)")
        from ckptio.engine.partner import agree_secret

        secret = agree_secret(self.group)  # every rank together, before any writer exists
        host = _advertised_host()
        listener = socket.create_server((host, 0), backlog=128)
        self._resources.callback(listener.close)
        me = (self.rank, node_identity(config.node_id), host, listener.getsockname()[1])
        gathered = self.group.gather_to_rank0(me)
        peers = [tuple(p) for p in self.group.broadcast_from_rank0(gathered)]
        partners = partner_ranks(peers, self.rank, config.replicas)
        start = LevelsStart(node=me[1], listen_fd=listener.fileno(), peers=tuple(peers),
                            partner_ranks=partners, timeout_s=config.partner_timeout_s, secret=secret)
        self._levels = LevelsRuntime(start=start, listener=listener)
        self._install_sigterm()

    def _install_sigterm(self) -> None:
        levels = self._levels
        if levels is None or self.config.preempt_grace_s <= 0 or threading.current_thread() is not \
                threading.main_thread():
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            if levels.preempted_at is None:
                levels.preempted_at = time.monotonic()

        levels.previous_handler = signal.signal(signal.SIGTERM, on_sigterm)
        self._resources.callback(self._restore_sigterm)

    def _restore_sigterm(self) -> None:
        levels = self._levels
        if levels is not None and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGTERM, levels.previous_handler or signal.SIG_DFL)

    # ---- saves -----------------------------------------------------------------------------------------------
    def _level_fields(self) -> dict[str, bool]:
        """The levels of the save being submitted (SaveJob fields); counts local saves for durable_every."""
        levels = self._levels
        if levels is None:
            return {}
        if levels.emergency:
            return {"durable": False, "local_level": True}
        levels.local_saves += 1
        return {"durable": levels.local_saves % self.config.durable_every == 0, "local_level": True}

    def emergency_save(self, step: int, state: dict[str, Any]) -> SaveHandle:
        """Save ``step`` to the local level and its partners now (the durable level with ``durable_every=1``) and
        wait at most ``preempt_grace_s`` (counted from the SIGTERM, if one came) for its commit. All ranks call
        together. Returns the handle; a save that did not commit in time is reported, never raised."""
        levels = self._levels
        t0 = levels.preempted_at if levels is not None and levels.preempted_at is not None else time.monotonic()
        if levels is not None:
            levels.emergency = True
        try:
            handle = self.save(step, state)
        finally:
            if levels is not None:
                levels.emergency = False
        with contextlib.suppress(CkptError, TimeoutError):
            handle.wait(max(0.0, t0 + self.config.preempt_grace_s - time.monotonic()))
        committed = handle.done() and handle.error is None and not handle.skipped
        self.events.emit(Event.PREEMPTED, step, committed=committed, seconds=time.monotonic() - t0,
                         level="local" if levels is not None else "durable",
                         error=str(handle.error) if handle.error else None)
        if not committed:
            log.warning("ckptio: emergency save of step %s did not commit within %.0f s: %s", step,
                        self.config.preempt_grace_s, handle.error or handle.skip_reason or "timed out")
        return handle

    @property
    def _lv_start(self) -> LevelsStart | None:
        return self._levels.start if self._levels is not None else None

    def _preempted(self) -> bool:
        """Has this rank received SIGTERM? (``maybe_save`` agrees it across ranks: engine.votes.)"""
        return self._levels is not None and self._levels.preempted_at is not None

    def _exit_preempted(self, step: int, state: dict[str, Any]) -> None:
        """After a SIGTERM on any rank: the emergency save, then a clean exit (pending durable uploads are
        abandoned: the local level holds a newer step)."""
        self.emergency_save(step, state)
        self.close(wait=False)
        raise SystemExit(0)

    # ---- restore ---------------------------------------------------------------------------------------------
    def _restore_levels(self, state: dict[str, Any], step: int | None) -> int | None:
        from ckptio.engine.sources import restore_from_levels

        return restore_from_levels(self, state, step)
