"""GlusterFS in the storage namespace: ``glusterd`` started by hand, a 2-brick distributed volume, one FUSE client
per node.

Rules:
- No systemd and no ``/var/lib/glusterd``: glusterd reads a volfile the lab writes, keeps its state, run files and
  Unix socket in the lab's directory (two labs never share one), and runs in the foreground (``-N``).
- Everything listens on the storage namespace's address (GlusterFS, like MooseFS, will not serve a volume on
  127.0.0.1); the bricks' ``glusterfsd`` processes glusterd forks live in that namespace too, so the teardown's
  sweep of the namespace stops them after glusterd.
- A node's mount is a ``glusterfs -N`` client run in its network namespace with ``nsenter --net``: visible to
  every process, its traffic on the node's shaped link.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ckptio.testing.cluster import netns
from ckptio.testing.cluster.procs import LabError, Proc, private_mounts, run, wait_until
from ckptio.testing.cluster.resources import Resources, mounted

GLUSTERD_PORT = 24007
VOLUME = "lab"
BRICKS = 2
BINARIES = ("glusterd", "gluster", "glusterfs", "glusterfsd")
PACKAGES = ("glusterfs-server", "glusterfs-client")
START_TIMEOUT_S = 60.0
SYSTEM_DIRS = ("/var/run/gluster", "/var/log/glusterfs", "/var/lib/glusterd")


def missing() -> str | None:
    """Why GlusterFS cannot run here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"GlusterFS is not installed ({', '.join(absent)}): apt-get install {' '.join(PACKAGES)}"
    return None


class GlusterFS:
    """One distributed GlusterFS volume served from ``ns`` at ``address``."""

    kind = "glusterfs"

    def __init__(self, res: Resources, ns: str, address: str, directory: Path,
                 mount_options: tuple[str, ...] = ()) -> None:
        self.res, self.ns, self.address, self.dir = res, ns, address, directory
        self.mount_options = mount_options
        self.socket = directory / "glusterd.socket"
        self.clients: dict[str, Proc] = {}

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._start_glusterd()
        bricks = []
        for index in range(BRICKS):
            brick = self.dir / "bricks" / f"b{index}"
            brick.mkdir(parents=True)
            bricks.append(f"{self.address}:{brick}")
        # A brick on the root filesystem needs "force"; a lab's bricks always are.
        self.cli("volume", "create", VOLUME, *bricks, "force")
        self.cli("volume", "set", VOLUME, "nfs.disable", "on", check=False)
        self.cli("volume", "start", VOLUME)

    def _start_glusterd(self) -> Proc:
        work, rundir = self.dir / "glusterd", self.dir / "run"
        work.mkdir()
        rundir.mkdir()
        volfile = self.dir / "glusterd.vol"
        volfile.write_text("\n".join([
            "volume management", "    type mgmt/glusterd", f"    option working-directory {work}",
            f"    option run-directory {rundir}", f"    option glusterd-sockfile {self.socket}",
            "    option transport-type socket", f"    option transport.socket.bind-address {self.address}",
            f"    option transport.socket.listen-port {GLUSTERD_PORT}", "    option ping-timeout 0",
            "    option event-threads 1", "    option base-port 49152", "    option max-port 60999",
            "end-volume", ""]))
        glusterd = ["glusterd", "-N", "-f", str(volfile), "-p", str(self.dir / "glusterd.pid"),
                    f"--log-file={self.dir / 'glusterd.log'}"]
        # glusterd and its bricks hard-code these system directories: give them the lab's (see private_mounts).
        binds = [(system, self.dir / "system" / system.strip("/").replace("/", "-")) for system in SYSTEM_DIRS]
        proc = self.res.spawn(private_mounts(binds, glusterd), name="glusterd", ns=self.ns,
                              log=self.dir / "glusterd.out")
        wait_until(lambda: netns.listening(self.ns, self.address, GLUSTERD_PORT) and self.socket.exists(),
                   START_TIMEOUT_S, "glusterd to listen", proc)
        return proc

    def cli(self, *args: str, check: bool = True) -> str:
        """Run a ``gluster`` command against this lab's glusterd (by its socket, never the system's)."""
        argv = ["gluster", f"--glusterd-sock={self.socket}", f"--log-file={self.dir / 'cli.log'}", "--mode=script",
                *args]
        done = run(netns.enter_argv(self.ns, argv), timeout=120.0, check=False)
        if check and done.returncode != 0:
            raise LabError(f"gluster {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def mount(self, node_ns: str, path: Path) -> Proc:
        path.mkdir(parents=True, exist_ok=True)
        if mounted(path):
            raise LabError(f"{path} is already a mount point")
        self.res.add_mount(path)
        log = self.dir / f"mount-{path.name}.log"
        argv = ["glusterfs", "-N", f"--volfile-server={self.address}", f"--volfile-id={VOLUME}",
                f"--log-file={log}", *self.mount_options, str(path)]
        proc = self.res.spawn(argv, name=f"glusterfs-{path.name}", ns=node_ns, log=self.dir / f"mount-{path.name}.out")
        self.clients[str(path)] = proc
        wait_until(lambda: mounted(path) and _has_space(path), START_TIMEOUT_S, f"the GlusterFS mount at {path}",
                   proc)
        return proc


def _has_space(path: Path) -> bool:
    try:
        return os.statvfs(path).f_blocks > 0
    except OSError:
        return False
