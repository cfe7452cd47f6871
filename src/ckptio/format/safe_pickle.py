"""Reading the two pickles a checkpoint holds without running code chosen by whoever can write to the store.

* ``.metadata`` (DCP's :class:`Metadata`) goes through :func:`load_metadata`: a :class:`pickle.Unpickler` whose
  ``find_class`` admits DCP's metadata classes, ``torch.Size``, dtypes and layouts, and a few plain builtins
  (:data:`METADATA_GLOBALS`). Any other global is an :class:`~ckptio.errors.UntrustedCheckpointError` raised
  before it is imported, let alone called. DCP's ``FileSystemWriter`` records the checkpoint directory as a
  ``pathlib`` path (``StorageMeta.checkpoint_id``), pickled as the path class applied to its parts: every path
  class, under any module name Python has given it (``pathlib``, ``pathlib._local``), is read as plain data — a
  pure path built from strings by :func:`_pure_path`, never the class the pickle names.
* A non-tensor value (DCP's ``BYTE_IO`` item, a ``torch.save`` blob) goes through :func:`load_object`:
  ``torch.load(weights_only=True)`` (tensors, containers, primitives) plus the caller's ``safe_globals``.

``trust_pickles=True`` turns both into plain unpickling: an explicit opt-in for stores only trusted writers can
reach (docs/security.md). This module never imports a module or calls a function that a pickle names unless it is
on an allowlist; it does no I/O.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Sequence
from typing import Any

from ckptio.errors import CorruptCheckpointError, UntrustedCheckpointError

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_METADATA_CLASSES = ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                     "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {(_DCP_METADATA, name) for name in _METADATA_CLASSES}
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # how torch.layout pickles: a lookup by name in torch's layouts
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "complex"),
    }
)
"""What a DCP ``.metadata`` pickle may name (besides ``torch.<dtype>`` and the path classes), as (module, name)."""

_PATH_MODULES = ("pathlib", "pathlib._local")  # pathlib's classes live in pathlib._local on Python 3.13
_PATH_FLAVOURS = {"PosixPath": "posix", "PurePosixPath": "posix", "WindowsPath": "windows",
                  "PureWindowsPath": "windows", "Path": "posix", "PurePath": "posix"}


def _pure_path(flavour: str) -> Any:
    """What a pickled path class is read as: a function that builds the pure path of ``flavour`` from string parts
    (a path that names no file system: a ``WindowsPath`` written on Windows reads on Linux too), and refuses any
    other argument."""
    import pathlib

    kind = pathlib.PureWindowsPath if flavour == "windows" else pathlib.PurePosixPath

    def build(*parts: Any) -> pathlib.PurePath:
        if not all(isinstance(p, str) for p in parts):
            raise UntrustedCheckpointError(f"a pickled path holds {[type(p).__name__ for p in parts]}, not strings")
        return kind(*parts)

    return build


def _is_dtype(module: str, name: str) -> bool:
    import torch  # lazily: importing the format (ls, verify, the writers of ranks > 0) must not load torch

    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, raw: bytes, path: str) -> None:
        super().__init__(io.BytesIO(raw))
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS or _is_dtype(module, name):
            return super().find_class(module, name)
        if module in _PATH_MODULES and name in _PATH_FLAVOURS:
            return _pure_path(_PATH_FLAVOURS[name])
        raise UntrustedCheckpointError(
            f"{self.path or '.metadata'} references {module}.{name}, which is not among the classes DCP metadata is "
            "made of (its metadata classes, torch sizes, dtypes and layouts, paths, plain builtins); refusing to load "
            "it (trust_pickles=True loads arbitrary pickles, see docs/security.md)",
            path=self.path or None,
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UntrustedCheckpointError(f"{self.path or '.metadata'} uses persistent ids", path=self.path or None)


def load_metadata(raw: bytes, *, path: str = "", trust_pickles: bool = False) -> Any:
    """DCP's Metadata from the bytes of ``.metadata``, refusing anything but metadata classes (unless
    ``trust_pickles``). Malformed bytes are CorruptCheckpointError; a foreign global UntrustedCheckpointError."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = pickle.loads(raw) if trust_pickles else _MetadataUnpickler(raw, path).load()
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # a malformed pickle raises anything: UnpicklingError, EOFError, KeyError, TypeError …
        raise CorruptCheckpointError(f"unreadable .metadata: {type(exc).__name__}: {exc}", path=path or None) from exc
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f".metadata holds a {type(metadata).__name__}, not DCP Metadata",
                                     path=path or None)
    return metadata


def load_object(blob: bytes | memoryview, *, safe_globals: Sequence[Any] = (), trust_pickles: bool = False,
                path: str = "") -> Any:
    """A non-tensor value DCP stored with ``torch.save``, loaded with ``weights_only`` semantics plus
    ``safe_globals`` (or fully unpickled with ``trust_pickles``)."""
    import torch

    stream = io.BytesIO(blob)
    if trust_pickles:
        return torch.load(stream, map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's weights-only unpickler refuses a global it does not admit with "... GLOBAL module.name ...";
        # any other UnpicklingError is damage, handled below.
        named = re.search(r"GLOBAL (\S+)", str(exc))
        if named is None:
            raise CorruptCheckpointError(f"value {path!r} is unreadable: {exc}", path=path or None) from exc
        raise UntrustedCheckpointError(
            f"value {path!r} references {named.group(1)}, which is outside the allowlist; if you trust it, add it "
            "to safe_globals, or opt in to trust_pickles (docs/security.md)", path=path or None) from exc
    except Exception as exc:  # a damaged zip or pickle raises anything
        raise CorruptCheckpointError(f"value {path!r} is unreadable: {type(exc).__name__}: {exc}",
                                     path=path or None) from exc
