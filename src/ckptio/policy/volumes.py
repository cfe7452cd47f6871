"""Volume checks: which device, mount and filesystem a checkpoint root sits on, against the data and $HOME.

Owns the rules "split the checkpoint volume from the dataset volume" and "never checkpoint into home
directories", and the facts they need (``/proc/mounts``, ``stat``, ``statvfs``). ``ckptio admit`` and the
Checkpointer's start-up check both call :func:`check_volumes`. This module must never write to any of the
paths it inspects, and never follow a root that is not a directory (object stores have no volume).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Literal

from ckptio.errors import ConfigError, VolumePolicyError
from ckptio.storage import PosixRoot, parse_root

logger = logging.getLogger(__name__)

MOUNTS_FILE = "/proc/mounts"
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
PARALLEL_FS = frozenset(
    {
        "lustre",
        "gpfs",
        "beegfs",
        "cephfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "wekafs",
        "fuse.weka",
        "panfs",
        "orangefs",
        "pvfs2",
        "fuse.juicefs",
        "daos",
        "fuse.dfuse",
    }
)
"""Filesystems built for many concurrent clients."""
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "virtiofs"})
"""Shared over the network, but one server (or one share) takes every client's writes."""
RAM_FS = frozenset({"tmpfs", "ramfs"})
"""Lost at reboot: fine for a local tier, never a durable root."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Mount:
    """One line of ``/proc/mounts``."""

    source: str
    """What is mounted (``/dev/nvme0n1p1``, ``server:/export``, ``tmpfs``)."""

    mount_point: str
    """Where it is mounted."""

    fs_type: str
    """Filesystem type (``ext4``, ``xfs``, ``nfs4``, ``lustre``, ``tmpfs``, …)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Volume:
    """The volume a path lives on (for a path that does not exist yet: its nearest existing parent's)."""

    path: str
    """The path asked about, made absolute."""

    existing: str
    """The path actually inspected: ``path`` or its nearest existing parent."""

    device: int
    """``st_dev``: two paths with equal devices share a filesystem."""

    mount: Mount | None
    """The mount holding the path (longest matching mount point), when ``/proc/mounts`` is readable."""

    free_bytes: int
    """Bytes available to an unprivileged writer."""

    total_bytes: int
    """Size of the filesystem."""

    @property
    def fs_type(self) -> str | None:
        return self.mount.fs_type if self.mount else None

    @property
    def kind(self) -> str:
        """``parallel``, ``network``, ``ram``, ``local`` or ``unknown``."""
        fs = self.fs_type
        if fs is None:
            return "unknown"
        if fs in PARALLEL_FS:
            return "parallel"
        if fs in NETWORK_FS:
            return "network"
        return "ram" if fs in RAM_FS else "local"


@dataclass(kw_only=True, slots=True, frozen=True)
class VolumeFinding:
    """One rule a root breaks (or a fact worth a warning)."""

    code: Literal["root-under-home", "root-on-data-volume", "root-on-ram"]
    """Stable name of the rule."""

    message: str
    """What is wrong and what to do, naming the paths."""


def read_mounts(path: str = MOUNTS_FILE) -> list[Mount]:
    """The mounts of this machine (empty when the file cannot be read, e.g. outside Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            mounts.append(
                Mount(source=_unescape(parts[0]), mount_point=_unescape(parts[1]), fs_type=parts[2])
            )
    return mounts


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash in names as octal escapes (\040 …).
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def volume_of(path: str | os.PathLike[str], *, mounts: list[Mount] | None = None) -> Volume:
    """The volume ``path`` is on; a path that does not exist yet is judged by its nearest existing parent."""
    root = parse_root(path)
    if not isinstance(root, PosixRoot):
        raise ConfigError(f"{os.fspath(path)!r} is not a filesystem path")
    absolute = os.path.realpath(root.path)
    existing = absolute
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    st = os.stat(existing)
    vfs = os.statvfs(existing)
    return Volume(
        path=absolute,
        existing=existing,
        device=st.st_dev,
        mount=_mount_for(existing, read_mounts() if mounts is None else mounts),
        free_bytes=vfs.f_bavail * vfs.f_frsize,
        total_bytes=vfs.f_blocks * vfs.f_frsize,
    )


def _mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        inside = point in ("/", path) or path.startswith(point + "/")
        # The last of equal mount points wins: later mounts shadow earlier ones (/dev/shm listed twice, say).
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best


def is_under(path: str, parent: str) -> bool:
    """True when ``path`` is ``parent`` or inside it (both resolved through symlinks)."""
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def check_volumes(
    root: str | os.PathLike[str],
    data_dirs: tuple[str, ...] | list[str] = (),
    *,
    home: str | None = None,
) -> list[VolumeFinding]:
    """The volume rules ``root`` breaks: under $HOME, on a data directory's volume, on a RAM filesystem.

    ``home`` defaults to ``$HOME``. A root that is not a directory (an object store) breaks none of them: it has
    no volume.
    """
    spec = parse_root(root)
    if not isinstance(spec, PosixRoot):
        return []
    mounts = read_mounts()
    vol = volume_of(spec.path, mounts=mounts)
    findings = []
    home = home if home is not None else os.environ.get("HOME")
    if home and os.path.realpath(home) != "/" and is_under(vol.path, home):
        findings.append(VolumeFinding(
            code="root-under-home",
            message=f"checkpoint root {vol.path} is under the home directory {home}: home volumes are "
            "small, quota'd and backed up; use a scratch or project filesystem",
        ))
    for data_dir in data_dirs:
        data = volume_of(data_dir, mounts=mounts)
        if data.device == vol.device:
            where = vol.mount.mount_point if vol.mount else f"device {vol.device}"
            findings.append(VolumeFinding(
                code="root-on-data-volume",
                message=f"checkpoint root {vol.path} and data directory {data.path} share one volume "
                f"({where}): the checkpoint burst competes with the data loader; use another volume",
            ))
    if vol.kind == "ram":
        findings.append(VolumeFinding(
            code="root-on-ram",
            message=f"checkpoint root {vol.path} is on {vol.fs_type} (RAM), lost at reboot: "
            "use it as local_dir, not as the durable root",
        ))
    return findings


def enforce_volume_policy(
    root: str | os.PathLike[str],
    data_dirs: tuple[str, ...] | list[str] = (),
    *,
    mode: Literal["off", "warn", "error"] = "warn",
    home: str | None = None,
) -> list[VolumeFinding]:
    """The Checkpointer's start-up check: log each finding (``warn``) or raise VolumePolicyError (``error``)."""
    if mode not in ("off", "warn", "error"):
        raise ConfigError(f"volume_check must be off, warn or error, got {mode!r}")
    if mode == "off":
        return []
    findings = check_volumes(root, data_dirs, home=home)
    if findings and mode == "error":
        raise VolumePolicyError("; ".join(f.message for f in findings), root=os.fspath(root))
    for finding in findings:
        logger.warning("ckptio volume check (%s): %s", finding.code, finding.message)
    return findings
