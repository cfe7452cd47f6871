"""Every exception ckptio raises, in one tree.

::

    CkptError                                  base; carries root / step / rank / path when known
    ├── ConfigError            (ValueError)    bad option, bad CLI argument, unparsable unit (CLI: exit 2)
    ├── CheckpointerClosedError(ValueError)    a method called on a closed Checkpointer
    │   └── CheckpointerForkedError            ... or in a process forked from the one that built it
    ├── UnsupportedStateError  (TypeError)     a value in the state that cannot be checkpointed
    ├── StructureMismatchError (ValueError)    restore target does not match the checkpoint
    ├── CheckpointNotFoundError(LookupError)   no such committed step
    ├── CorruptCheckpointError                 manifest/index/metadata (or an event file) unreadable or inconsistent
    │   ├── ChecksumError                      a file's bytes do not match the recorded checksum
    │   ├── UntrustedCheckpointError           a pickle in the store names code restore will not run (security.md)
    │   └── UnknownExtensionError              an item was stored through a DCP stream extension this process lacks
    ├── StorageError           (OSError)       a storage operation failed (after retries)
    │   ├── NotFoundError      (FileNotFoundError)
    │   ├── AlreadyExistsError (FileExistsError)  create-only write found the key present
    │   ├── PreconditionError                  If-Match compare-and-swap lost
    │   ├── StorageFullError                   ENOSPC, or the local tier's byte budget is spent
    │   ├── StoreCapabilityError               the store lacks a guarantee or API ckptio relies on (conditional
    │   │                                      writes, public-access/region APIs); says what it means and the options
    │   └── ReplicationError                   a partner node did not take a copy of a local-level save
    ├── CommitError                            a step could not be committed (ranks missing, lost race)
    ├── WriterDiedError        (RuntimeError)  the writer process of a rank exited
    ├── PeerLostError          (ConnectionError) another rank died or never came during a restore (rank, phase)
    ├── RootInUseError                         another live job owns this checkpoint root
    ├── ResidencyError         (PermissionError) public bucket or forbidden region
    ├── VolumePolicyError                      the root breaks a volume rule and ``volume_check="error"``
    └── AdmissionError                         the planner refuses the job (only `ckptio admit`)

A failed background save has no class of its own: ``SaveHandle.wait()`` and ``Checkpointer.wait()`` re-raise the
error that failed it (``StorageFullError``, ``CommitError``, ``WriterDiedError``, …), so a caller catches the cause it
can act on. Catch ``CkptError`` for "any save failure".

Errors cross process boundaries (writer → trainer), so every class pickles with its context.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AdmissionError",
    "AlreadyExistsError",
    "CheckpointNotFoundError",
    "CheckpointerClosedError",
    "CheckpointerForkedError",
    "ChecksumError",
    "CkptError",
    "CommitError",
    "ConfigError",
    "CorruptCheckpointError",
    "NotFoundError",
    "PeerLostError",
    "PreconditionError",
    "ReplicationError",
    "ResidencyError",
    "RootInUseError",
    "StorageError",
    "StorageFullError",
    "StoreCapabilityError",
    "StructureMismatchError",
    "UnknownExtensionError",
    "UnsupportedStateError",
    "UntrustedCheckpointError",
    "VolumePolicyError",
    "WriterDiedError",
]

_CONTEXT_KEYS = ("root", "step", "rank", "path")


def _rebuild(cls: type[CkptError], message: str, context: dict[str, Any]) -> CkptError:
    return cls(message, **context)


class CkptError(Exception):
    """Base of every ckptio error. ``str()`` names the context (root, step, rank, path) it carries."""

    def __init__(
        self,
        message: str,
        *,
        root: str | None = None,
        step: int | None = None,
        rank: int | None = None,
        path: str | None = None,
    ) -> None:
        self.message = message
        self.root = root
        self.step = step
        self.rank = rank
        self.path = path
        super().__init__(message)

    @property
    def context(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _CONTEXT_KEYS if getattr(self, k) is not None}

    def __str__(self) -> str:
        ctx = ", ".join(f"{k}={v}" for k, v in self.context.items())
        return f"{self.message} [{ctx}]" if ctx else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.context))


class ConfigError(CkptError, ValueError):
    """An option or argument is invalid."""


class CheckpointerClosedError(CkptError, ValueError):
    """A Checkpointer method was called after ``close()``. A ValueError, as for an operation on a closed file."""


class CheckpointerForkedError(CheckpointerClosedError):
    """A Checkpointer method was called in a process forked from the one that built it. Its writer, staging slots
    and root claim are the parent's, and its threads did not survive the fork: the child's copy is closed to it
    (``close()`` there does nothing). Build a Checkpointer in the child instead."""


class UnsupportedStateError(CkptError, TypeError):
    """The state holds a value that cannot be checkpointed."""


class StructureMismatchError(CkptError, ValueError):
    """The state given to restore does not match the checkpoint's keys, shapes or dtypes."""


class CheckpointNotFoundError(CkptError, LookupError):
    """The requested step (or any committed step) does not exist."""


class CorruptCheckpointError(CkptError):
    """A manifest, index or metadata file is missing, unreadable or inconsistent."""


class ChecksumError(CorruptCheckpointError):
    """A data file's bytes do not match the checksum recorded when it was written."""


class UntrustedCheckpointError(CorruptCheckpointError):
    """A pickle read from the store (``.metadata`` or a non-tensor value) references a class or function outside
    the allowlist. Restore refuses it rather than run code chosen by whoever can write to the store; see
    docs/security.md for ``safe_globals`` and ``trust_pickles``."""


class UnknownExtensionError(CorruptCheckpointError):
    """An item of the checkpoint was written through a DCP stream extension (compression, encryption: its
    ``transform_descriptors``) that this process cannot decode: not in the extension registry the reader was given
    (DCP's default holds ZStandard), or its module is missing. The message names the descriptor. Its encoded bytes
    are never handed to ``torch.load``."""


class StorageError(CkptError, OSError):
    """A storage operation failed."""

    def __init__(self, message: str, **context: Any) -> None:
        CkptError.__init__(self, message, **context)

    def __str__(self) -> str:
        return CkptError.__str__(self)


class NotFoundError(StorageError, FileNotFoundError):
    """The key does not exist."""


class AlreadyExistsError(StorageError, FileExistsError):
    """A create-only write found the key already present."""


class PreconditionError(StorageError):
    """A conditional write (If-Match) lost: the object changed since it was read."""


class StorageFullError(StorageError):
    """No space left (ENOSPC), or the local tier's byte budget is spent."""


class StoreCapabilityError(StorageError):
    """The store does not honour a guarantee ckptio relies on (create-only or compare-and-swap writes, multipart
    uploads, ranged reads), or lacks an API a check needs (bucket public-access status, region). Raised before
    anything is written; the message says what is missing, what that means, and the options (docs/s3.md)."""


class ReplicationError(StorageError):
    """A partner node did not acknowledge its copy of a local-level save (unreachable, timed out, refused, or the
    bytes arrived damaged): that save's local level is not committed; training goes on."""


class CommitError(CkptError):
    """A step could not be committed."""


class WriterDiedError(CkptError, RuntimeError):
    """The writer process of a rank exited while saves were pending."""


class PeerLostError(CkptError, ConnectionError):
    """Another rank of the job died, or never came, while this rank waited for it in a restore: ``rank`` names it
    (None when the transport cannot tell which) and ``phase`` says where (``ready``: the gate before planning;
    ``exchange``: while ranges moved between ranks; ``load``: in DCP's own collectives)."""

    def __init__(self, message: str, *, phase: str | None = None, **context: Any) -> None:
        self.phase = phase
        super().__init__(message, **context)

    @property
    def context(self) -> dict[str, Any]:
        return {**super().context, **({"phase": self.phase} if self.phase is not None else {})}


class RootInUseError(CkptError):
    """Another live job owns this checkpoint root."""


class ResidencyError(CkptError, PermissionError):
    """Writing here would break residency: a public bucket or a region outside the allowed list."""


class VolumePolicyError(CkptError):
    """The Checkpointer's start-up volume check (``volume_check="error"``) refuses the root: under $HOME, on a data
    directory's volume, or on a RAM filesystem."""


class AdmissionError(CkptError):
    """``ckptio admit`` refuses the job: its storage cannot take the burst, or its root breaks a placement rule."""
