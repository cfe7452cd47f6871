"""The lab: N node namespaces and a storage namespace on a shaped bridge, a parallel filesystem mounted in every
node, and S3; started in one call and always torn down.

Layout (one lab; ``P`` is its prefix, ``ckl<pid>-<n>``, unique per process and lab):
- namespace ``P-fab`` holds the bridge and one port per endpoint: nothing else, no uplink;
- namespace ``P-store`` at ``<subnet>.2`` runs the storage daemons behind a link of ``store_mbit``;
- namespace ``P-node<i>`` at ``<subnet>.<10+i>`` is node i, behind a link of ``node_mbit``, with its mount of the
  parallel filesystem at ``<lab dir>/mnt/node<i>`` and its local disk at ``<lab dir>/local/node<i>``.

Rules:
- ``start`` either returns a running lab or tears down what it made and raises; ``close`` is idempotent, goes on
  past errors, and runs from the context manager, from a ``weakref.finalize`` (garbage collection, interpreter
  exit), or by hand. Where the lab cannot run at all, ``start`` raises :class:`LabUnavailable` with the reason.
- Every process the lab starts is recorded (:mod:`ckptio.testing.cluster.resources`) and stopped by its id;
  every mount is unmounted by path; every namespace deleted by name.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ckptio.testing.cluster import jobs, netns, objstore, resources
from ckptio.testing.cluster.checks import LabUnavailable, reason
from ckptio.testing.cluster.glusterfs import GlusterFS
from ckptio.testing.cluster.moosefs import MooseFS
from ckptio.testing.cluster.procs import LabError, Proc, wait_until
from ckptio.testing.cluster.resources import Resources, kill_namespace, unmount
from ckptio.testing.cluster.topology import LabConfig, LabNode

_labs = itertools.count()
PREFIX_LEN = 24


def default_base() -> Path:
    """Where labs keep their directories (and :func:`cleanup_stale` looks for dead ones)."""
    return Path(tempfile.gettempdir()) / "ckptio-lab"


@dataclass
class Timings:
    network_s: float = 0.0
    pfs_s: float = 0.0
    s3_s: float = 0.0
    mounts_s: float = 0.0
    start_s: float = 0.0
    close_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class Lab:
    """A running cluster lab; use as a context manager (``with Lab(LabConfig(nodes=2)) as lab:``)."""

    def __init__(self, config: LabConfig | None = None) -> None:
        self.config = config or LabConfig()
        why = reason(self.config.pfs, self.config.s3)
        if why:
            raise LabUnavailable(why)
        self.prefix = f"ckl{os.getpid()}-{next(_labs)}"
        self.dir = (self.config.base or default_base()) / self.prefix
        self.fabric = f"{self.prefix}-fab"
        self.storage_ns = f"{self.prefix}-store"
        self.storage_address = f"{self.config.subnet}.2"
        self.nodes = [LabNode(i, f"{self.prefix}-node{i}", f"{self.config.subnet}.{10 + i}", f"n{i}",
                              self.dir / "mnt" / f"node{i}", self.dir / "local" / f"node{i}")
                      for i in range(self.config.nodes)]
        # Where a launched process finds its node's mount and local disk: one path on every node, as a cluster
        # mounts its parallel filesystem (see jobs.launch).
        self.pfs_path = self.dir / "pfs"
        self.local_path = self.dir / "node-local"
        self.res = Resources(self.dir)
        self.pfs: MooseFS | GlusterFS | None = None
        self.s3: objstore.S3Endpoint | None = None
        self.timings = Timings()
        self.rates = {self.storage_ns: self.config.store_mbit, **{n.ns: self.config.node_mbit for n in self.nodes}}
        self.started = False
        self._finalizer = weakref.finalize(self, _finalize, self.res)
        self._ports = itertools.count(29500)

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        return self if self.started else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Lab:
        """Build everything; on any failure tear down what was made and re-raise."""
        began = time.monotonic()
        if self.started:
            raise LabError(f"lab {self.prefix} was already started")
        self.started = True
        try:
            self.dir.mkdir(parents=True, exist_ok=False)
            self.res.save()
            self._timed("network_s", self._network)
            if self.config.pfs != "none":
                self._timed("pfs_s", self._start_pfs)
            if self.config.s3 != "none":
                self._timed("s3_s", self._start_s3)
            if self.pfs is not None:
                self._timed("mounts_s", self._mount_all)
        except BaseException:
            self.close()
            raise
        self.timings.start_s = time.monotonic() - began
        return self

    def close(self) -> None:
        """Tear everything down (idempotent). Raises ``LabError`` listing what could not be removed."""
        began = time.monotonic()
        errors = self.res.teardown()
        self.timings.close_s = time.monotonic() - began
        if errors:
            raise LabError("lab teardown left errors:\n" + "\n".join(errors))

    def _timed(self, slot: str, fn: Callable[[], None]) -> None:
        began = time.monotonic()
        fn()
        setattr(self.timings, slot, time.monotonic() - began)

    def _endpoints(self) -> list[tuple[str, str, str, float]]:
        """(namespace, bridge port, address, Mbit/s) of the storage, then of every node."""
        return [(self.storage_ns, "st", self.storage_address, self.rates[self.storage_ns]),
                *((n.ns, n.port, n.address, self.rates[n.ns]) for n in self.nodes)]

    def _endpoint(self, endpoint: int | str) -> tuple[str, str, str, float]:
        wanted = self.storage_ns if endpoint == "store" else self.nodes[int(endpoint)].ns
        return next(e for e in self._endpoints() if e[0] == wanted)

    def peers(self, address: str) -> list[str]:
        """The addresses an endpoint talks to, in the order of its htb classes (``1:a``, ``1:b``, ...)."""
        return [a for _, _, a, _ in self._endpoints() if a != address]

    def _network(self) -> None:
        self.res.add_namespace(self.fabric)
        netns.make_bridge(self.fabric)
        for ns, port, address, mbit in self._endpoints():
            self.res.add_namespace(ns)
            netns.attach(self.fabric, ns, port, address, PREFIX_LEN)
            netns.shape_link(self.fabric, ns, port, mbit, self.peers(address))
        for node in self.nodes:
            node.local.mkdir(parents=True, exist_ok=True)
        self.pfs_path.mkdir()
        self.local_path.mkdir()

    def _start_pfs(self) -> None:
        cls = MooseFS if self.config.pfs == "moosefs" else GlusterFS
        self.pfs = cls(self.res, self.storage_ns, self.storage_address, self.dir / self.config.pfs,
                       self.config.mount_options)
        self.pfs.start()

    def _start_s3(self) -> None:
        kind = objstore.choose(self.config.s3)
        self.s3 = objstore.start(self.res, kind, self.storage_ns, self.storage_address, self.dir / "s3")
        self.s3.host_url = self.forward(self.config.s3_via_node, self.storage_address, objstore.S3_PORT)
        objstore.create_bucket(self.s3)

    def _mount_all(self) -> None:
        assert self.pfs is not None
        for node in self.nodes:
            self.pfs.mount(node.ns, node.mount)

    # ---- services ---------------------------------------------------------------------------------------------
    def forward(self, node: int, host: str, port: int) -> str:
        """A loopback URL (``http://127.0.0.1:<p>``) in the host's namespace whose connections reach ``host:port``
        from inside node ``node`` (crossing its shaped link)."""
        from ckptio.testing.cluster import forward

        port_file = self.dir / f"forward-{node}-{port}.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, forward.__file__, str(netns.ns_path(self.nodes[node].ns)),
                host, str(port), str(port_file)]
        proc = self.res.spawn(argv, name=f"forward-{node}-{port}", log=self.dir / f"forward-{node}-{port}.log")
        wait_until(port_file.exists, 30.0, "the loopback forwarder", proc)
        return f"http://127.0.0.1:{port_file.read_text().strip()}"

    def launch(self, node: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               name: str | None = None, stdout: int | None = None) -> Proc:
        """Start ``argv`` in node ``node``'s namespace (:func:`ckptio.testing.cluster.jobs.launch`)."""
        return jobs.launch(self, node, argv, env=env, name=name, stdout=stdout)

    def launch_ranks(self, argv: Sequence[str], nodes: Sequence[int], *, ranks_per_node: int = 1,
                     env: Mapping[str, str] | None = None) -> jobs.RankJob:
        """gloo ranks of ``argv`` across ``nodes`` (:func:`ckptio.testing.cluster.jobs.launch_ranks`)."""
        return jobs.launch_ranks(self, argv, nodes, ranks_per_node=ranks_per_node, env=env)

    def start_loader(self, node: int, directory: Path, out: Path, *, interval_s: float = 0.5) -> Proc:
        """A loader on ``node`` reading ``directory`` in a loop (:func:`ckptio.testing.cluster.jobs.start_loader`)."""
        return jobs.start_loader(self, node, directory, out, interval_s=interval_s)

    def next_port(self) -> int:
        """A fresh rendezvous port for a job (nothing else listens inside the lab's namespaces)."""
        return next(self._ports)

    # ---- node loss --------------------------------------------------------------------------------------------
    def lose_node(self, node: int, *, revive: bool = True) -> float:
        """Lose node ``node`` for real: SIGKILL every process in its namespace (ranks, writers, loaders, its FUSE
        client), unmount its dead mount, wipe its local disk. With ``revive`` the node comes back empty: the mount
        is made again, so a restarted rank finds the shared volume. Returns the seconds it took."""
        began = time.monotonic()
        target = self.nodes[node]
        kill_namespace(target.ns)
        for proc in [*self.res.jobs, *self.res.daemons]:
            if not proc.alive():
                proc.wait(1.0)
                self.res.forget(proc)
        unmount(target.mount)
        shutil.rmtree(target.local, ignore_errors=True)
        target.local.mkdir(parents=True)
        if revive and self.pfs is not None:
            self.pfs.mount(target.ns, target.mount)
        return time.monotonic() - began

    def reshape(self, endpoint: int | str, mbit: float) -> None:
        """Set one link's rate, both directions, while the lab runs (node ``endpoint`` or ``"store"``): a matrix
        of store links needs no new lab. The htb trees are replaced whole; their byte counts start again."""
        ns, port, address, _ = self._endpoint(endpoint)
        netns.shape_link(self.fabric, ns, port, mbit, self.peers(address))
        self.rates[ns] = mbit

    def link_bytes(self, endpoint: int | str) -> dict[str, dict[str, int]]:
        """Bytes each direction of a link has carried, per peer address, as its htb classes counted them:
        ``{"up": {peer: n}, "down": {peer: n}}`` for node ``endpoint`` (an index) or ``"store"``."""
        ns, port, address, _ = self._endpoint(endpoint)
        up, down = netns.class_bytes(ns, netns.DEVICE), netns.class_bytes(self.fabric, port)
        classes = {f"1:{10 + i:x}": peer for i, peer in enumerate(self.peers(address))}
        return {"up": {peer: up.get(c, 0) for c, peer in classes.items()},
                "down": {peer: down.get(c, 0) for c, peer in classes.items()}}

    def procs(self) -> list[Proc]:
        """Every process the lab has started and not yet seen end (daemons and jobs)."""
        return [*self.res.daemons, *self.res.jobs]


def cleanup_stale(base: Path | None = None) -> list[str]:
    """Remove what labs whose owner died (a crashed or killed test run) left behind; labs of live processes are
    never touched. See :func:`ckptio.testing.cluster.resources.cleanup_stale`."""
    return resources.cleanup_stale(base or default_base())


def _finalize(res: Resources) -> None:
    """Garbage collection or interpreter exit without ``close``: remove everything, quietly."""
    res.teardown()
