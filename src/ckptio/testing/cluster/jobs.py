"""Work inside the lab's nodes: any process, gloo ranks across nodes, a loader per node, a bulk transfer.

Rules:
- A process launched on a node runs in that node's network namespace (``nsenter --net``) and sees the host's
  files, its mounts included. Its environment is this process's, minus any ``AWS_*`` (they would point at a
  server the node cannot reach), plus the lab's S3 (``AWS_ENDPOINT_URL`` at the storage namespace), and:
  ``CKPTIO_PARTNER_HOST`` (the node's address: ckptio's partner server binds it and peers dial it),
  ``GLOO_SOCKET_IFNAME=eth0`` (gloo would otherwise resolve the shared host name to an address no node has), and
  ``CKPTIO_LAB_NODE`` (``node<i>``, what a job passes as ``node_id``).
- Ranks get what torchrun sets: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``
  (the node's index in the job; ckptio's default node identity is ``<host>#<GROUP_RANK>``, distinct per node
  although every namespace shares the host name), ``MASTER_ADDR`` (the job's first node) and ``MASTER_PORT``.
- A launched process sees its node's mount of the parallel filesystem at ``lab.pfs_path`` and its node's local
  disk at ``lab.local_path``: the same paths on every node, as a cluster mounts its filesystem at one path
  everywhere (each process gets a mount namespace of its own with these two bind mounts; the host's view, and
  every other mount, stay as they are). Jobs can then pass every rank the same root.
- Every process is recorded by the lab as a job: stopped (SIGKILL) before the mounts go at teardown.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptio.testing.cluster import loader, netperf
from ckptio.testing.cluster.procs import LabError, Proc, private_mounts, wait_until
from ckptio.testing.cluster.resources import mounted
from ckptio.testing.cluster.topology import LabView


def node_env(lab: LabView, node: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on ``node`` (see the module's rules)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    if lab.s3 is not None:
        env.update(lab.s3.env())
    target = lab.nodes[node]
    env.update(CKPTIO_PARTNER_HOST=target.address, GLOO_SOCKET_IFNAME="eth0", CKPTIO_LAB_NODE=target.name,
               PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def launch(lab: LabView, node: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
           name: str | None = None, stdout: int | None = None, text: bool = True) -> Proc:
    """Start ``argv`` on ``node``; stdout and stderr go to ``<lab dir>/logs/<name>.log`` unless ``stdout`` is
    given (``subprocess.PIPE``: then only stderr goes to the log)."""
    name = name or f"{lab.nodes[node].name}-{Path(argv[0]).name}-{time.monotonic_ns()}"
    logs = lab.dir / "logs"
    logs.mkdir(exist_ok=True)
    target = lab.nodes[node]
    binds = [(str(lab.local_path), target.local)]
    if mounted(target.mount):
        binds.append((str(lab.pfs_path), target.mount))
    return lab.res.spawn(private_mounts(binds, argv), name=name, ns=target.ns, job=True, log=logs / f"{name}.log",
                         env=node_env(lab, node, env), stdout=stdout, text=text)


class RankJob:
    """Ranks launched across nodes; each rank's stdout lines are collected by a thread, JSON ones parsed."""

    def __init__(self, procs: list[Proc], nodes: list[int]) -> None:
        self.procs, self.nodes = procs, nodes
        self.queues: list[queue.Queue[str | None]] = []
        for proc in procs:
            lines: queue.Queue[str | None] = queue.Queue()
            threading.Thread(target=_drain, args=(proc, lines), daemon=True).start()
            self.queues.append(lines)

    def line(self, rank: int, key: str, timeout: float = 120.0) -> dict[str, Any]:
        """The next JSON line of ``rank`` holding ``key`` (other lines are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                raw = self.queues[rank].get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise LabError(f"rank {rank}: no {key!r} within {timeout:.0f} s\n{self.procs[rank].tail()}") from None
            if raw is None:
                self.queues[rank].put(None)  # stays at its end for the next caller
                raise LabError(f"rank {rank} exited before printing {key!r}:\n{self.procs[rank].tail()}")
            if raw.startswith("{"):
                record = json.loads(raw)
                if key in record:
                    return dict(record)

    def wait(self, timeout: float = 120.0) -> list[int | None]:
        """Each rank's exit code (None for one still running at the deadline)."""
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for proc in self.procs:
            assert proc.popen is not None
            try:
                codes.append(proc.popen.wait(timeout=max(0.01, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            proc.stop(0.0)


def _drain(proc: Proc, lines: queue.Queue[str | None]) -> None:
    assert proc.popen is not None and proc.popen.stdout is not None
    with proc.popen.stdout:
        for raw in proc.popen.stdout:
            lines.put(raw.rstrip("\n"))
    lines.put(None)


def launch_ranks(lab: LabView, argv: Sequence[str], nodes: Sequence[int], *, ranks_per_node: int = 1,
                 env: Mapping[str, str] | None = None, port: int | None = None) -> RankJob:
    """``len(nodes) * ranks_per_node`` ranks of ``argv``, rank ``r`` on ``nodes[r // ranks_per_node]``, joined by
    gloo at the first node's address. Their stdout is read by the returned :class:`RankJob`."""
    port = port or lab.next_port()
    world = len(nodes) * ranks_per_node
    procs = []
    for rank in range(world):
        group = rank // ranks_per_node
        node = nodes[group]
        rank_env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % ranks_per_node),
                    "LOCAL_WORLD_SIZE": str(ranks_per_node), "GROUP_RANK": str(group), "NODE_RANK": str(group),
                    "MASTER_ADDR": lab.nodes[nodes[0]].address, "MASTER_PORT": str(port), **(env or {})}
        procs.append(launch(lab, node, argv, env=rank_env, name=f"rank{rank}-{lab.nodes[node].name}-{port}",
                            stdout=subprocess.PIPE))
    return RankJob(procs, [nodes[r // ranks_per_node] for r in range(world)])


def start_loader(lab: LabView, node: int, directory: Path, out: Path, *, interval_s: float = 0.5,
                 block: int = 1 << 20) -> Proc:
    """A loader on ``node`` reading every file under ``directory`` (on the node's mount) in a loop, appending its
    throughput per ``interval_s`` to ``out`` as JSON lines (:func:`read_loader`)."""
    argv = [sys.executable, loader.__file__, str(directory), str(out), str(interval_s), str(block)]
    return launch(lab, node, argv, name=f"loader-{lab.nodes[node].name}-{time.monotonic_ns()}")


def read_loader(out: Path) -> list[dict[str, float]]:
    """The loader's samples so far: ``{"t", "bytes", "mbit"}`` each."""
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def write_dataset(directory: Path, files: int, size: int) -> None:
    """``files`` files of ``size`` random bytes for loaders to read."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        (directory / f"shard{index:04d}.bin").write_bytes(os.urandom(size))


def measure_mbit(lab: LabView, src: int, dst: int, seconds: float = 3.0, *, streams: int = 1,
                 port: int = 5201) -> dict[str, float]:
    """A bulk TCP transfer from node ``src`` to node ``dst`` for ``seconds``: what the receiver counted."""
    out = lab.dir / f"netperf-{src}-{dst}-{time.monotonic_ns()}.json"
    target = lab.nodes[dst].address
    server = launch(lab, dst, [sys.executable, netperf.__file__, "serve", target, str(port), str(out), str(streams)],
                    name=f"netperf-serve-{dst}-{time.monotonic_ns()}")
    wait_until(Path(f"{out}.ready").exists, 30.0, "the netperf server", server)
    sender = launch(lab, src, [sys.executable, netperf.__file__, "send", target, str(port), str(seconds),
                               str(streams)], name=f"netperf-send-{src}-{time.monotonic_ns()}")
    wait_until(out.exists, seconds + 60.0, "the netperf report", server)
    sender.wait(30.0)
    server.wait(5.0)
    lab.res.forget(sender)
    lab.res.forget(server)
    return dict(json.loads(out.read_text()))
