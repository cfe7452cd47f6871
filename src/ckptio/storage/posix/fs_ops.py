"""The POSIX backend's transport seam: the few filesystem operations its conditional writes rest on.

A create-only write and a compare-and-swap must exclude writers on *other clients* of a shared filesystem (two
nodes mounting one Lustre, GPFS, NFS, MooseFS or GlusterFS volume), not just other processes of this host. So they
are built only on operations the filesystem's server decides, once, for every client:

* ``link(tmp, name)``: fails with EEXIST when ``name`` exists (the classic NFS lock primitive);
* ``open(name, O_CREAT | O_EXCL)``: fails with EEXIST when ``name`` exists;
* ``rename(a, b)``: atomic replacement of ``b``, and of a given ``a`` only one renamer succeeds;
* a directory listing: which file a name holds now, where a client's cache may still answer a stat with the file
  another client replaced a moment ago.

Never ``flock`` or ``lockf``: MooseFS, GlusterFS and SeaweedFS's FUSE clients ignore a directory ``flock`` across
mounts, and SeaweedFS ignores ``lockf`` too. This class is the seam: :class:`~ckptio.storage.posix.posix_storage.
PosixStorage` calls these and nothing else for exclusion, so a test can stand in a filesystem that refuses hard links
or ignores ``O_EXCL`` (a subclass overriding one method), and ``ckptio probe`` reports what the root honours.

Instances hold no state and pickle by class: every process of a job gets the same behaviour.
"""

from __future__ import annotations

import errno
import os

__all__ = ["LINK_REFUSED", "TMP_PREFIX", "FileSystemOps"]

#: First characters of every name the backend writes that is not an object (temp files, lock files): listings
#: skip them.
TMP_PREFIX = ".tmp-"
#: How a filesystem says it has no hard links (FUSE object-store mounts, some SMB/CIFS and VFAT mounts).
LINK_REFUSED = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


class FileSystemOps:
    """The operations of a directory that exclusion rests on (the defaults: plain system calls)."""

    def link(self, src: str, dst: str) -> None:
        """Make ``dst`` a second name of ``src``; FileExistsError when ``dst`` exists."""
        os.link(src, dst, follow_symlinks=False)

    def create_exclusive(self, path: str, data: bytes) -> os.stat_result:
        """Create ``path`` holding ``data`` only if no such name exists (FileExistsError otherwise); returns the
        new file's stat, whose inode names this very file from now on."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, data)
            return os.fstat(fd)
        finally:
            os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        """Rename ``src`` onto ``dst``, replacing it atomically; FileNotFoundError when ``src`` is gone."""
        os.replace(src, dst)

    def stat(self, path: str) -> os.stat_result:
        """The file at ``path`` itself (never a link's target)."""
        return os.stat(path, follow_symlinks=False)

    def listed_inodes(self, directory: str, names: set[str]) -> dict[str, int]:
        """The inode numbers a listing of ``directory`` gives for those of ``names`` it holds (no stat: the entries
        as the directory has them, which a client's attribute cache does not answer)."""
        with os.scandir(directory) as entries:
            return {entry.name: entry.inode() for entry in entries if entry.name in names}

    def read(self, path: str, limit: int = 4096) -> bytes:
        """The first ``limit`` bytes of a small file."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))
