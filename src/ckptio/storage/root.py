"""What a checkpoint root names, once parsed: the base of every backend's root value.

A root string (a path, ``file:///…``, ``s3://bucket/prefix``) is read once, by
:func:`ckptio.storage.registry.parse_root`, which hands it to the backend registered for its scheme. The backend
returns a :class:`Root`: a frozen, comparable value that says where the root is and nothing else. Callers that
need a directory (volume checks, the probe's system calls) ask ``isinstance(root, PosixRoot)``
(:mod:`ckptio.storage.posix.posix_root`); everything else opens it with :func:`ckptio.storage.registry.open_storage`.

This module never touches a filesystem or the network, and names no backend.
"""

from __future__ import annotations

import abc

__all__ = ["Root"]


class Root(abc.ABC):
    """A parsed root. Subclasses are frozen dataclasses (compared by value, hashable) with a URL to print."""

    __slots__ = ()

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The root as a URL, for messages (a backend's storage may spell it more precisely)."""
