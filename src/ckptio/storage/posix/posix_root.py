"""POSIX roots: a plain path or a ``file:`` URL names a directory of this host.

* A plain path is a directory, taken as written (relative paths stay relative).
* ``file:`` URLs follow RFC 8089: the path is percent-decoded (``file:///a%20b`` is the directory ``/a b``), the
  host may be empty or ``localhost``, and any other host is refused (this process cannot write there).

Never touches the filesystem.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from ckptio.errors import ConfigError
from ckptio.storage.root import Root

__all__ = ["PosixRoot", "parse_file_url"]

_LOCAL_HOSTS = ("", "localhost")


@dataclass(frozen=True, slots=True)
class PosixRoot(Root):
    """A directory (absolute, or relative to the current directory)."""

    path: str

    @property
    def url(self) -> str:
        return Path(os.path.abspath(self.path)).as_uri()


def parse_file_url(url: str) -> PosixRoot:
    """The directory a ``file:`` URL names per RFC 8089 (``file:///p``, ``file://localhost/p``, ``file:/p``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc.lower() not in _LOCAL_HOSTS:
        raise ConfigError(
            f"{url!r} names the host {parts.netloc!r}: only local file:// URLs can be roots "
            "(file:///path or file://localhost/path); mount the filesystem and give its local path"
        )
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ConfigError(f"{url!r} has a query or fragment: percent-encode '?' and '#' in file:// paths")
    if not parts.path.startswith("/"):
        raise ConfigError(f"{url!r} has no absolute path (use file:///absolute/path)")
    # Percent-decoding to bytes then fsdecode inverts pathlib's as_uri, even for names that are not UTF-8.
    return PosixRoot(os.fsdecode(urllib.parse.unquote_to_bytes(parts.path)))
