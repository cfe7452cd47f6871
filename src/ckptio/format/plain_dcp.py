"""Plain DCP checkpoints: a directory written by ``torch.distributed.checkpoint.save`` (``FileSystemWriter``), with a
``.metadata`` and ``__<rank>_<n>.distcp`` files but no ckptio manifest.

ckptio reads them (restore, ``verify``) with what DCP records: ``.metadata`` (allowlisted unpickler) for where each
item lies, the objects' real sizes for the files, and the zip CRC-32 that ``torch.save`` keeps for every record of
each item (:func:`~ckptio.format.torchsave.zip_crc_problem`); DCP itself records no checksum. A directory is plain
DCP when it holds ``.metadata``, no ``manifest.json`` and no ``ranks/`` index: a ckptio save that did not commit
has rank indexes beside its ``.metadata``, and is never taken for one. Retention and cleanup must leave plain DCP
directories alone (ckptio did not write them); :func:`is_plain_dcp` is the one test of what they are.
"""

from __future__ import annotations

from typing import Any

from ckptio.errors import CorruptCheckpointError, StorageError
from ckptio.format.keys import MANIFEST, METADATA, RANKS_DIR, check_file_name, step_dir
from ckptio.format.records import FileRecord, Manifest
from ckptio.storage.base import ReadStore, Storage, join_key


def _exists(storage: ReadStore, key: str) -> bool:
    try:
        storage.head(key)
    except StorageError:
        return False
    return True


def is_plain_dcp(storage: Storage, step: int) -> bool:
    """Whether ``step``'s directory is a plain DCP checkpoint (``.metadata``, no manifest, no rank index)."""
    prefix = step_dir(step)
    if not _exists(storage, join_key(prefix, METADATA)) or _exists(storage, join_key(prefix, MANIFEST)):
        return False
    return next(iter(storage.list(join_key(prefix, RANKS_DIR) + "/")), None) is None


def plain_manifest(storage: ReadStore, prefix: str, step: int | None, metadata: Any) -> Manifest:
    """What stands in for a manifest in a plain DCP directory at ``prefix``: every file ``.metadata`` places an item
    in, with its real size and no checksum. A file name that leaves the directory, or a file that is missing, is
    :class:`~ckptio.errors.CorruptCheckpointError`."""
    names = sorted({getattr(info, "relative_path", None) for info in metadata.storage_data.values()}, key=str)
    files: dict[str, FileRecord] = {}
    for name in names:
        if not isinstance(name, str):
            raise CorruptCheckpointError(f".metadata places an item in {name!r}", root=storage.url, step=step)
        check_file_name(name, step=step if step is not None else -1, path=join_key(prefix, METADATA))
        key = join_key(prefix, name) if prefix else name
        try:
            size = storage.head(key).size
        except StorageError as exc:
            raise CorruptCheckpointError(f".metadata places items in {name}, which is missing ({exc})",
                                         root=storage.url, step=step, path=key) from exc
        files[name] = FileRecord(name=name, size=size, crc32c="", key=key)
    return Manifest(step=step if step is not None else 0, world_size=0, save_id=0, files=files,
                    total_bytes=sum(f.size for f in files.values()))
