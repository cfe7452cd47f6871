"""Checks of the local files a command line names (``--out``, ``--events``), made before any work starts.

Owns the one rule: a file a command will write must not be a directory and must have an existing, writable
parent directory; a file it will read must be a readable regular file. A failure is a
:class:`~ckptio.errors.ConfigError` naming the flag (exit 2), so a probe or a simulation never runs for minutes
and then fails to save its answer. Not a subcommand: ``main`` never registers it. Must never create or write
anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ckptio.errors import CkptError, ConfigError


def check_output(path: str | None, flag: str) -> None:
    """Refuse ``path`` now when writing it later cannot work."""
    if path is None:
        return
    if not path.strip():
        raise ConfigError(f"{flag} needs a file name", path=path)
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is a directory: give a file name", path=path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"{flag} {path!r}: the directory {parent!r} does not exist", path=path)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path!r}: the directory {parent!r} is not writable", path=path)


@contextmanager
def writing(path: str, flag: str) -> Iterator[None]:
    """Turn an OSError while writing ``path`` (the disk filled, the directory went away) into a ConfigError."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, CkptError):  # StorageError is an OSError too: it keeps its own meaning
            raise
        raise ConfigError(f"cannot write {flag} {path!r}: {exc.strerror or exc}", path=path) from None
