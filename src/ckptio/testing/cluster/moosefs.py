"""MooseFS in the storage namespace: a master and two chunkservers started by hand, one FUSE mount per node.

Rules:
- No systemd and no ``/etc``: every daemon reads a config file the lab writes into its own directory, keeps its
  data there, and runs in the foreground (``-f``) so the pid the lab recorded is the daemon's.
- The daemons listen on the storage namespace's address, never on 127.0.0.1 (MooseFS refuses a master there) and
  never on a host address: only the lab's nodes can reach them.
- A node's mount is made by ``mfsmount -f`` run in that node's network namespace with ``nsenter --net``: its
  traffic crosses the node's shaped link, while the mount itself is in the host's mount namespace, visible to every
  process. Each node is a separate client of the one volume.
- A mount is ready once its ``statvfs`` shows space: that is when the chunkservers have registered with the master
  (before, a write would fail with ENOSPC).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ckptio.testing.cluster import netns
from ckptio.testing.cluster.procs import LabError, Proc, wait_until
from ckptio.testing.cluster.resources import Resources, mounted

MASTER_CS_PORT = 9420
MASTER_CLIENT_PORT = 9421
CHUNK_PORTS = (9422, 9423)
EMPTY_METADATA = Path("/var/lib/mfs/metadata.mfs.empty")
BINARIES = ("mfsmaster", "mfschunkserver", "mfsmount")
PACKAGES = ("moosefs-master", "moosefs-chunkserver", "moosefs-client")
# Timeouts for daemons that start in about a second here; generous for a loaded 2-core CI machine.
START_TIMEOUT_S = 60.0


def missing() -> str | None:
    """Why MooseFS cannot run here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent or not EMPTY_METADATA.exists():
        return (f"MooseFS is not installed ({', '.join(absent) or EMPTY_METADATA}): "
                f"apt-get install {' '.join(PACKAGES)} (make labdeps)")
    return None


def _config(path: Path, values: dict[str, object]) -> Path:
    path.write_text("".join(f"{key} = {value}\n" for key, value in values.items()))
    return path


class MooseFS:
    """One MooseFS volume served from ``ns`` at ``address``; ``mount`` attaches a node to it."""

    kind = "moosefs"

    def __init__(self, res: Resources, ns: str, address: str, directory: Path,
                 mount_options: tuple[str, ...] = ()) -> None:
        self.res, self.ns, self.address, self.dir = res, ns, address, directory
        self.mount_options = mount_options
        self.clients: dict[str, Proc] = {}

    def start(self) -> None:
        """Master first, then the chunkservers (they register with it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        master = self._start_master()
        for index, port in enumerate(CHUNK_PORTS):
            self._start_chunkserver(index, port, master)

    def _common(self, data: Path, ident: str) -> dict[str, object]:
        data.mkdir(parents=True, exist_ok=True)
        # Root, no nice/OOM games, and no memory locking: this is a test lab, not a production daemon.
        return {"WORKING_USER": "root", "WORKING_GROUP": "root", "DATA_PATH": data, "SYSLOG_IDENT": ident,
                "NICE_LEVEL": 0, "DISABLE_OOM_KILLER": 0, "LOCK_MEMORY": 0}

    def _start_master(self) -> Proc:
        data = self.dir / "master"
        values = self._common(data, "ckl-mfsmaster")
        shutil.copyfile(EMPTY_METADATA, data / "metadata.mfs")
        exports = self.dir / "mfsexports.cfg"
        exports.write_text("*\t/\trw,alldirs,admin,maproot=0:0\n")
        values.update(EXPORTS_FILENAME=exports, MATOML_LISTEN_HOST=self.address, MATOCS_LISTEN_HOST=self.address,
                      MATOCL_LISTEN_HOST=self.address, MATOCS_LISTEN_PORT=MASTER_CS_PORT,
                      MATOCL_LISTEN_PORT=MASTER_CLIENT_PORT)
        cfg = _config(self.dir / "mfsmaster.cfg", values)
        proc = self.res.spawn(["mfsmaster", "-f", "-c", str(cfg)], name="mfsmaster", ns=self.ns,
                              log=self.dir / "mfsmaster.log")
        wait_until(lambda: netns.listening(self.ns, self.address, MASTER_CLIENT_PORT), START_TIMEOUT_S,
                   "the MooseFS master to listen", proc)
        return proc

    def _start_chunkserver(self, index: int, port: int, master: Proc) -> Proc:
        data = self.dir / f"chunkserver{index}"
        disk = data / "disk"
        disk.mkdir(parents=True, exist_ok=True)
        hdd = self.dir / f"mfshdd{index}.cfg"
        hdd.write_text(f"{disk}\n")
        values = self._common(data, f"ckl-mfscs{index}")
        values.update(HDD_CONF_FILENAME=hdd, MASTER_HOST=self.address, MASTER_PORT=MASTER_CS_PORT,
                      BIND_HOST=self.address, CSSERV_LISTEN_HOST=self.address, CSSERV_LISTEN_PORT=port,
                      HDD_LEAVE_SPACE_DEFAULT="64MiB", HDD_TEST_SPEED=0)
        cfg = _config(self.dir / f"mfschunkserver{index}.cfg", values)
        proc = self.res.spawn(["mfschunkserver", "-f", "-c", str(cfg)], name=f"mfschunkserver{index}",
                              ns=self.ns, log=self.dir / f"mfschunkserver{index}.log")
        wait_until(lambda: netns.listening(self.ns, self.address, port), START_TIMEOUT_S,
                   f"MooseFS chunkserver {index} to listen", proc)
        return proc

    def mount(self, node_ns: str, path: Path) -> Proc:
        """Mount the volume at ``path`` as a client running in ``node_ns``; returns once writes can land."""
        path.mkdir(parents=True, exist_ok=True)
        if mounted(path):
            raise LabError(f"{path} is already a mount point")
        self.res.add_mount(path)
        options = ["-o", ",".join(self.mount_options)] if self.mount_options else []
        proc = self.res.spawn(["mfsmount", str(path), "-f", "-H", self.address, "-P", str(MASTER_CLIENT_PORT),
                               *options], name=f"mfsmount-{path.name}", ns=node_ns,
                              log=self.dir / f"mfsmount-{path.name}.log")
        self.clients[str(path)] = proc
        wait_until(lambda: mounted(path) and _has_space(path), START_TIMEOUT_S, f"the MooseFS mount at {path}", proc)
        return proc


def _has_space(path: Path) -> bool:
    try:
        stats = os.statvfs(path)
    except OSError:
        return False
    return stats.f_blocks > 0 and stats.f_bavail > 0
