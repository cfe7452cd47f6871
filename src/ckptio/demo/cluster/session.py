"""The lab side of the cluster demo: start a lab, keep a loader reading on every node, run the job's ranks on it,
lose a node and resume, probe the store from inside the nodes.

It starts and stops processes and returns what the ranks printed; it never summarizes
(:mod:`ckptio.demo.cluster.figures`) and never prints (:mod:`ckptio.demo.cluster.runner`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptio.demo.cluster import lab_rank
from ckptio.demo.cluster.cpu import CpuSampler
from ckptio.testing.cluster import Lab, LabConfig, Proc
from ckptio.testing.cluster.jobs import RankJob, read_loader, write_dataset

DATA_DIR = "loader-data"
"""The loaders' data set, on the parallel filesystem beside the checkpoints."""


@dataclass(frozen=True, slots=True)
class JobRun:
    """What one launch of the job's ranks printed: per rank, its ``result`` (train) or ``resume`` record."""

    records: list[dict[str, Any]]
    launched: float
    """Wall time of the launch."""
    cpu: list[tuple[float, float, float]] = field(default_factory=list)
    """:class:`~ckptio.demo.cluster.cpu.CpuSampler`'s samples over the run: the writers' and FUSE clients' CPU."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """A node lost while the job trained, and the job resumed from what survived."""

    killed: float
    """Wall time of the kill."""
    relaunched: float
    """Wall time the new ranks were launched (the kill, the wipe and the remount came before)."""
    ranks: list[dict[str, Any]]
    """Each resumed rank's ``resume`` record: phase times, restored step, level, sources."""


@dataclass
class LabSession:
    """One running lab with a loader on each node; ``with LabSession(config) as s: ...``."""

    config: LabConfig
    loaders: bool = True
    data_files: int = 4
    data_file_mib: int = 8
    lab: Lab = field(init=False)
    loader_outs: list[Path] = field(default_factory=list)
    loader_procs: list[Proc] = field(default_factory=list)

    owns_lab: bool = True

    @classmethod
    def on(cls, lab: Lab) -> LabSession:
        """A session on a lab that someone else started and will stop (a test's shared lab); no loaders."""
        session = cls(lab.config, loaders=False, owns_lab=False)
        session.lab = lab
        return session

    def __enter__(self) -> LabSession:
        if not self.owns_lab:
            return self
        self.lab = Lab(self.config).start()
        try:
            if self.loaders:
                self.start_loaders()
        except BaseException:
            self.lab.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_loaders()
        if self.owns_lab:
            self.lab.close()

    def start_loaders(self) -> None:
        """A loader on every node reading the data set on the parallel filesystem, again and again."""
        data = self.lab.nodes[0].mount / DATA_DIR
        if not data.exists():
            write_dataset(data, files=self.data_files, size=self.data_file_mib << 20)
        self.loader_outs = []
        for node in self.lab.nodes:
            out = self.lab.dir / f"loader-{node.index}-{time.monotonic_ns()}.jsonl"
            self.loader_procs.append(self.lab.start_loader(node.index, self.lab.pfs_path / DATA_DIR, out,
                                                           interval_s=0.25))
            self.loader_outs.append(out)

    def stop_loaders(self) -> None:
        for proc in self.loader_procs:
            proc.stop(0.0)
            self.lab.res.forget(proc)
        self.loader_procs = []

    def loader_samples(self) -> list[list[dict[str, float]]]:
        return [read_loader(out) for out in self.loader_outs]

    def pfs_root(self, name: str) -> tuple[str, Path]:
        """A fresh directory on the parallel filesystem: (the path ranks use, the path this process uses)."""
        host = self.lab.nodes[0].mount / "runs" / name
        host.mkdir(parents=True, exist_ok=True)
        return str(self.lab.pfs_path / "runs" / name), host

    def s3_root(self, name: str) -> str:
        assert self.lab.s3 is not None
        return f"s3://{self.lab.s3.bucket}/{name}"

    def launch(self, spec: dict[str, Any], nodes: list[int], ranks_per_node: int) -> tuple[RankJob, float]:
        launched = time.time()
        job = self.lab.launch_ranks([sys.executable, lab_rank.__file__, json.dumps(spec)], nodes,
                                    ranks_per_node=ranks_per_node, env={"CKPTIO_LAB_LAUNCHED": repr(launched)})
        return job, launched

    def run_job(self, spec: dict[str, Any], nodes: list[int], ranks_per_node: int, *,
                timeout: float = 300.0) -> tuple[JobRun, RankJob]:
        """Launch the ranks, wait for every rank's record (``result`` for training, ``resume`` for a resume)."""
        job, launched = self.launch(spec, nodes, ranks_per_node)
        key = "result" if spec["phase"] == "train" else "resume"
        try:
            with CpuSampler([p.pid for p in job.procs], self.fuse_clients(nodes)) as cpu:
                records = [job.line(rank, key, timeout)[key] for rank in range(len(job.procs))]
        except BaseException:
            job.kill()
            raise
        if not spec.get("hang"):
            job.wait(120.0)
            job.kill()
        return JobRun(records, launched, cpu.samples), job

    def fuse_clients(self, nodes: list[int]) -> list[int]:
        """The process ids of ``nodes``' parallel-filesystem clients (``mfsmount``; none for a kernel client)."""
        names = {f"mfsmount-{self.lab.nodes[n].mount.name}" for n in nodes}
        return [p.pid for p in self.lab.procs() if p.name in names]

    def lose_and_resume(self, job: RankJob, spec: dict[str, Any], node: int, nodes: list[int],
                        ranks_per_node: int) -> Recovery:
        """Lose ``node`` for real while ``job`` trains, end the rest of the job (as a launcher would on a failed
        rank), drop the host's page cache (a replaced node, and every other node's, start cold), and relaunch
        every rank with ``spec`` (a resume)."""
        for rank in range(len(job.procs)):
            job.line(rank, "hanging", 120.0)
        killed = time.time()
        self.lab.lose_node(node)
        job.kill()
        drop_page_cache()
        run, _ = self.run_job(spec, nodes, ranks_per_node)
        if self.loader_procs:  # the lost node's loader went with it: the next run finds one on every node again
            self.stop_loaders()
            self.start_loaders()
        return Recovery(killed=killed, relaunched=run.launched, ranks=run.records)

    def probe(self, node: int, target: str, out: Path, *, writers: int, file_size: str, files_per_writer: int,
              seconds: float, start_at: float) -> Proc:
        """Start ``ckptio probe TARGET --out OUT`` inside ``node`` (its mount, its link); it begins measuring at
        wall time ``start_at``, after its imports, so probes on several nodes measure the store together."""
        wait_then_run = ("import sys, time; from ckptio._cli import main, probe_cmd; "
                         f"time.sleep(max(0.0, {start_at!r} - time.time())); sys.exit(main.main(sys.argv[1:]))")
        argv = [sys.executable, "-c", wait_then_run, "probe", target, "--writers", str(writers),
                "--file-size", file_size, "--files-per-writer", str(files_per_writer), "--small-files", "64",
                "--max-seconds", f"{seconds:g}", "--out", str(out), "--json", "--store-private"]
        return self.lab.launch(node, argv, name=f"probe-{node}-{time.monotonic_ns()}", stdout=subprocess.PIPE)


def drop_page_cache() -> None:
    """Empty the host's page cache (every node's, as a replaced node and a restarted job meet it); a no-op where
    the process may not."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass
