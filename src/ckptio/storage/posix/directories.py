"""The POSIX backend's directories: made on demand, durable when asked, and waited for while another client of a
shared filesystem is still making them.

Two clients of a distributed filesystem creating one directory may see it half made: GlusterFS creates it on one
brick, then the others, so the second client's ``mkdir`` says it exists while a create in it fails ENOENT on a
brick it has not reached yet, and a lookup of a handle the other client just made may answer ESTALE. A fresh lookup
a moment later finds it whole (the NFS and GlusterFS clients' remedy for ESTALE). :func:`make_and_fill` retries
only an error that names the file being created or one of the directories: nothing was written then.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

__all__ = ["DIRECTORY_RACE_WAITS_S", "fsync_dir", "make_and_fill", "make_dirs"]

#: How long a write waits, and again, for a directory another client is still making: a distributed filesystem
#: finishes a mkdir on every server within milliseconds; a second is far past that.
DIRECTORY_RACE_WAITS_S = (0.01, 0.05, 0.25, 1.0)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: str, *, fsync: bool) -> None:
    """``directory`` and those above it, each new one fsynced into its parent when ``fsync``."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(directory)
    if parent != directory:
        make_dirs(parent, fsync=fsync)
    try:
        os.mkdir(directory)
    except FileExistsError:
        return
    if fsync:
        fsync_dir(parent)


def make_and_fill(directory: str, path: str, fill: Callable[[str], None], *, fsync: bool) -> None:
    """Make ``directory``, then ``fill(path)`` (which creates ``path`` in it); again after a moment while another
    client's ``mkdir`` of it is still under way (module docstring), up to :data:`DIRECTORY_RACE_WAITS_S`."""
    for wait in (*DIRECTORY_RACE_WAITS_S, None):
        try:
            make_dirs(directory, fsync=fsync)
            fill(path)
            return
        except OSError as exc:
            if wait is None or not _half_made(exc, directory, path):
                raise
        time.sleep(wait)


def _half_made(exc: OSError, directory: str, path: str) -> bool:
    """ENOENT or ESTALE naming ``path`` (its create) or ``directory`` or one above it (a mkdir)."""
    if exc.errno not in (errno.ENOENT, errno.ESTALE) or not isinstance(exc.filename, str):
        return False
    named = exc.filename.rstrip("/")
    return named in (path, directory) or directory.startswith(named + "/")
