"""The scheme registry: which backend a root string names, and how a storage of it is opened. (contract)

Owns the one reader of root strings, :func:`parse_root`, and :func:`open_storage`:

* a plain path is a directory, taken as written; ``C:/x`` or ``run:3`` are paths too (a URL needs ``://``);
* ``<scheme>://…`` goes to the backend registered for the scheme (case-insensitive); ``file:`` also in RFC 8089's
  short form ``file:/path``;
* any other scheme is a :class:`~ckptio.errors.ConfigError`.

A backend is a package under ``ckptio/storage/`` that gives this table one :class:`Backend` line: its schemes, a
parser of its URLs into a :class:`~ckptio.storage.root.Root` value (light: it may import no optional dependency),
and the dotted name of its :class:`~ckptio.storage.base.Storage` class, whose ``open_root(root, **options)``
opens such a root. The class is imported only when a root of its backend is opened, so a backend whose client
library is an optional extra (boto3 for S3) costs nothing to a job that does not use it.

This module is the only one outside a backend's own package that names a backend. It never touches a filesystem
or the network.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckptio.errors import ConfigError
from ckptio.storage.base import Storage
from ckptio.storage.posix.posix_root import PosixRoot, parse_file_url
from ckptio.storage.root import Root
from ckptio.storage.s3.s3_root import S3Root, parse_s3_url

__all__ = ["BACKENDS", "Backend", "backend_of", "open_storage", "parse_root", "storage_modules"]

# RFC 3986 scheme, then ":": "C:/x" or "run:3" are not URLs unless "//" follows (or the backend takes the short form).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(//)?")


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend as the registry knows it."""

    name: str
    """Its name in messages and docs (``posix``, ``s3``)."""

    schemes: tuple[str, ...]
    """URL schemes it reads, lower case."""

    root_type: type[Root]
    """The root value its parser returns."""

    parse: Callable[[str], Root]
    """``url`` → root; ConfigError naming what is wrong with a URL of its scheme."""

    storage: str
    """``module:Class`` of its storage; imported on first open. The class has ``open_root(root, **options)``."""

    short_form: bool = False
    """Whether ``scheme:path`` without ``//`` is a URL of it too (RFC 8089 ``file:/path``)."""

    def open(self, root: Root, **options: Any) -> Storage:
        module, _, name = self.storage.partition(":")
        cls = getattr(importlib.import_module(module), name)
        storage: Storage = cls.open_root(root, **options)
        return storage


#: Every backend, in the order schemes are matched. A new backend adds its line here.
BACKENDS: tuple[Backend, ...] = (
    Backend(name="posix", schemes=("file",), root_type=PosixRoot, parse=parse_file_url,
            storage="ckptio.storage.posix.posix_storage:PosixStorage", short_form=True),
    Backend(name="s3", schemes=("s3",), root_type=S3Root, parse=parse_s3_url,
            storage="ckptio.storage.s3.s3_storage:S3Storage"),
)


def parse_root(target: str | os.PathLike[str] | Root) -> Root:
    """The root ``target`` names; :class:`~ckptio.errors.ConfigError` when it names none this library can use."""
    if isinstance(target, Root):
        return target
    text = os.fspath(target)
    if not text:
        raise ConfigError("empty storage path")
    match = _SCHEME.match(text)
    if match is None:
        return PosixRoot(text)
    scheme, url = match.group(1).lower(), match.group(2) is not None
    for backend in BACKENDS:
        if scheme in backend.schemes and (url or backend.short_form):
            return backend.parse(text)
    if not url:
        return PosixRoot(text)
    known = ", ".join(f"{s}://" for b in BACKENDS for s in b.schemes)
    raise ConfigError(f"unsupported storage URL {text!r} (use a path, or one of {known})")


def backend_of(root: Root) -> Backend:
    """The backend whose parser makes roots like ``root``."""
    for backend in BACKENDS:
        if isinstance(root, backend.root_type):
            return backend
    raise ConfigError(f"no storage backend is registered for {type(root).__name__}")


def open_storage(target: str | os.PathLike[str] | Root | Storage, **options: Any) -> Storage:
    """A storage for ``target``: a :class:`Storage` as is, else the storage of the root it names.

    ``options`` go to the backend's storage (``PosixStorage``'s keywords, or the S3 backend's ``S3Options``
    fields; docs/s3.md); an option the backend does not know is a ConfigError.
    """
    if isinstance(target, Storage):
        return target
    root = parse_root(target)
    return backend_of(root).open(root, **options)


def storage_modules() -> list[str]:
    """The module of every backend's storage class (a process pool preloads them: one import per pool, not per
    worker). Their optional client libraries are imported later, on first use."""
    return [b.storage.partition(":")[0] for b in BACKENDS]
