"""The planner's side of the cluster demo: ``ckptio probe`` run inside the lab's nodes, then ``ckptio plan`` and
``ckptio admit`` on what it measured, as a user would run them before a job.

Where the figures come from (none is a constant):

- the store: one ``ckptio probe`` per node of the job, all at once, each from inside its node (its mount of the
  parallel filesystem, or the S3 endpoint, across its own shaped link). The job's aggregate write and read rates are
  the sums of what the nodes measured together (one node alone may be held by its own link, below what the store
  gives several); one rank's writer cap is its node's rate shared by the node's ranks; the metadata rates are the
  first node's profile's. These go to ``plan`` and ``admit`` as a ``--profile`` with the aggregate flags over it;
- the job: its bytes (``--params`` at 12 bytes per parameter, fp32 weights and two moments, ZeRO-3: every rank an
  equal share), its step time (the calm phase's median, measured by the ranks) and its interval;
- the host: this machine's cores shared by every rank (``--cores-per-rank``);
- the network: the node link's rate (``--network-bandwidth``), known from the lab's shape: partner copies cross it,
  and so does the store's traffic, beside the all-reduce the steps send (``--collective-bytes``, from the job's
  gradient: the lab has one network, so a save's bytes cost the steps network time).

It runs commands and reads their JSON; it never measures the job and never decides what is shown.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptio.demo.cluster.session import LabSession
from ckptio.plan.measure.probe import SERIALIZE_MIN_BOUND_S

IMPORT_GRACE_S = 8.0
"""Time the probes get to import before they all start measuring at once (this machine's cores are shared)."""
PROBE_SECONDS = SERIALIZE_MIN_BOUND_S - 1.0
"""The probes' bound: just below the one at which a probe measures the serialize rate before its writes (CPU-bound
on the shared cores, it made the nodes' writes start seconds apart)."""
PROBE_FILES_PER_WRITER = 64
"""More than a probe's write window takes (it stops at the window's end): each node writes for the whole window."""
BYTES_PER_PARAM = 12
"""fp32 weights and Adam's two fp32 moments (``--weights-dtype fp32 --optimizer adam-fp32``): the lab rank's state."""


@dataclass(frozen=True, slots=True)
class StoreFigures:
    """What the probes measured, for ``plan``: the job's aggregate and one rank's cap."""

    kind: str
    write_bytes_per_s: float
    read_bytes_per_s: float
    per_writer_bytes_per_s: float
    metadata_ops_per_s: float | None
    profile: Path
    per_node_write: list[float]


@dataclass(frozen=True, slots=True)
class JobShape:
    """The lab job as ``plan`` reads it."""

    ranks: int
    ranks_per_node: int
    state_bytes_per_rank: float
    step_time_s: float
    every: int
    cores: int = 2
    durable_every: int = 1
    network_bytes_per_s: float | None = None
    local_bytes_per_s: float | None = None
    grad_bytes: float = 0.0
    """The gradient every step all-reduces across the ranks, through the node links the store's traffic crosses
    too (the lab has one network)."""

    def collective_bytes(self) -> float:
        """What one rank's ring all-reduce of the gradient sends per step: 2·(N−1)/N of it."""
        return 2.0 * (self.ranks - 1) / self.ranks * self.grad_bytes if self.ranks > 1 else 0.0


def probe_store(session: LabSession, nodes: list[int], target: str, out_dir: Path, *, ranks_per_node: int,
                file_size: str = "32MiB", seconds: float = PROBE_SECONDS) -> StoreFigures:
    """``ckptio probe`` on every node in ``nodes`` at once against ``target`` (``pfs`` or ``s3``).

    Each node's figure is only its share of the store while every node writes at once: the probes must write over
    the same seconds. So they start together (``start_at``), skip the serialize measurement (:data:`PROBE_SECONDS`) and
    write files for their whole write window rather than one file each (one 32 MiB file took about a second: a node that
    started early wrote much of it alone). With one file each after a serialize phase, the nodes' sum reached 129 MB/s
    on an 800 Mbit/s link in one run, and their spread put the slowest node's figure 8–10 % under its share in
    others."""
    out_dir.mkdir(parents=True, exist_ok=True)
    procs, profiles = [], []
    start_at = time.time() + IMPORT_GRACE_S
    for node in nodes:
        where = (f"{session.lab.pfs_path}/probe-{out_dir.name}-{node}" if target == "pfs"
                 else session.s3_root(f"probe-{out_dir.name}-{node}"))
        profiles.append(out_dir / f"probe-{target}-{node}.json")
        procs.append(session.probe(node, where, profiles[-1], writers=ranks_per_node, file_size=file_size,
                                   files_per_writer=PROBE_FILES_PER_WRITER, seconds=seconds, start_at=start_at))
    figures = []
    for proc, path in zip(procs, profiles, strict=True):
        assert proc.popen is not None
        proc.popen.communicate(timeout=seconds * 4 + 120)
        session.lab.res.forget(proc)
        if proc.popen.returncode != 0:
            raise RuntimeError(f"ckptio probe exited {proc.popen.returncode}: {proc.tail()}")
        figures.append(json.loads(path.read_text()))
    first = figures[0]
    return StoreFigures(
        kind=first["kind"],
        write_bytes_per_s=sum(f["write_bytes_per_s"] for f in figures),
        read_bytes_per_s=sum(f["read_bytes_per_s"] for f in figures),
        per_writer_bytes_per_s=min(f["write_bytes_per_s"] for f in figures) / ranks_per_node,
        metadata_ops_per_s=first.get("metadata_ops_per_s"),
        profile=profiles[0],
        per_node_write=[f["write_bytes_per_s"] for f in figures],
    )


def probe_local(directory: Path, profile: Path) -> float:
    """The nodes' local disk (a directory of this machine): ``ckptio probe`` without fsync; its write rate."""
    _ckptio(["probe", str(directory), "--writers", "1", "--file-size", "64MiB", "--files-per-writer", "1",
             "--small-files", "16", "--max-seconds", "10", "--no-fsync", "--out", str(profile), "--json"])
    return float(json.loads(profile.read_text())["write_bytes_per_s"])


def job_flags(job: JobShape, store: StoreFigures) -> list[str]:
    """The job, the store and the host as ``plan`` and ``admit`` spell them."""
    params = job.state_bytes_per_rank * job.ranks / BYTES_PER_PARAM
    flags = ["--params", f"{params:.0f}", "--weights-dtype", "fp32", "--optimizer", "adam-fp32", "--zero", "3",
             "--ranks", str(job.ranks), "--profile", str(store.profile),
             "--write-bandwidth", f"{store.write_bytes_per_s:.0f}B/s",
             "--read-bandwidth", f"{store.read_bytes_per_s:.0f}B/s",
             "--per-writer-bandwidth", f"{store.per_writer_bytes_per_s:.0f}B/s",
             "--step-time", f"{job.step_time_s:.6f}", "--interval", str(job.every)]
    return flags


def plan(job: JobShape, store: StoreFigures) -> dict[str, Any]:
    """``ckptio plan --json`` of the job on the probed store (two levels when the job has them)."""
    flags = [*job_flags(job, store), "--cores-per-rank", f"{job.cores / job.ranks:.3f}", "--train-cores", "1",
             "--ranks-per-node", str(job.ranks_per_node)]
    if job.network_bytes_per_s:  # the node link: partner copies, and the store's traffic beside the all-reduce
        flags += ["--network-bandwidth", f"{job.network_bytes_per_s:.0f}B/s",
                  "--collective-bytes", f"{job.collective_bytes():.0f}B"]
    if job.durable_every > 1 and job.network_bytes_per_s and job.local_bytes_per_s:
        flags += ["--local-bandwidth", f"{job.local_bytes_per_s:.0f}B/s", "--durable-every", str(job.durable_every)]
    return dict(json.loads(_ckptio(["plan", *flags, "--json"]).stdout))


def admit(job: JobShape, store: StoreFigures, root: str) -> dict[str, Any]:
    """``ckptio admit --json``: the verdict, and its reasons."""
    done = _ckptio(["admit", *job_flags(job, store), "--root", root, "--json"], check=False)
    verdict = dict(json.loads(done.stdout))
    verdict["exit_code"] = done.returncode
    return verdict


def _ckptio(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "ckptio._cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ckptio {args[0]} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done
