"""Cross-checks between the three records of a committed step: the manifest, DCP's ``.metadata`` and the rank
indexes.

Checksums say a file is the one its record describes; these checks say the records describe one checkpoint: every
item DCP will read lies inside a file the manifest lists and checksums, every name the metadata declares has its
bytes, and ``.metadata`` places each item where the rank that wrote it said it did. Pure functions over parsed
records (the metadata comes from :func:`~ckptio.format.safe_pickle.load_metadata`); no storage access.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ckptio.format.blocks import block_layout_problem
from ckptio.format.records import Manifest, RankIndex

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _item_problem(idx: Any, info: Any, manifest: Manifest) -> str | None:
    fqn = getattr(idx, "fqn", idx)
    name: Any = getattr(info, "relative_path", None)
    offset: Any = getattr(info, "offset", None)
    length: Any = getattr(info, "length", None)
    if not isinstance(name, str) or name not in manifest.files:
        return f"item {fqn!r} lies in {name!r}, a file the manifest does not list"
    if not (_is_int(offset) and _is_int(length)) or offset < 0 or length < 0:
        return f"item {fqn!r} has a malformed byte range ({offset!r}, {length!r})"
    if offset + length > manifest.files[name].size:
        return (f"item {fqn!r} (bytes {offset}..{offset + length}) runs past the end of {name} "
                f"({manifest.files[name].size} bytes)")
    return None


def _chunk_nbytes(md: TensorStorageMetadata, sizes: Any) -> int:
    import torch  # lazily: importing the format must not load torch (the checks run only on a real .metadata)

    return math.prod(int(s) for s in sizes) * torch.empty((), dtype=md.properties.dtype).element_size()


def _declared_problems(metadata: Any, storage_data: dict[Any, Any]) -> list[str]:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex, TensorStorageMetadata
    problems: list[str] = []
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            if MetadataIndex(fqn) not in storage_data:
                problems.append(f"value {fqn!r} has no stored bytes")
        elif isinstance(md, TensorStorageMetadata):
            for chunk in md.chunks:
                info = storage_data.get(MetadataIndex(fqn, chunk.offsets))
                if info is None:
                    problems.append(f"tensor {fqn!r} chunk at {tuple(chunk.offsets)} has no stored bytes")
                elif _is_int(info.length) and info.length < _chunk_nbytes(md, chunk.sizes):
                    problems.append(f"tensor {fqn!r} chunk at {tuple(chunk.offsets)} is stored in {info.length} "
                                    f"bytes, fewer than its {_chunk_nbytes(md, chunk.sizes)} bytes of data")
        else:
            problems.append(f"{fqn!r} has metadata of unknown kind {type(md).__name__}")
    return problems


def metadata_problems(metadata: Any, manifest: Manifest) -> list[str]:
    """What is wrong between ``.metadata`` and the manifest: items outside listed files or past their end, items
    of undeclared names, declared names (and tensor chunks) without bytes. Empty when they agree."""
    storage_data = getattr(metadata, "storage_data", None)
    declared = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(storage_data, dict) or not isinstance(declared, dict):
        return ["storage_data and state_dict_metadata must be dicts"]
    problems: list[str] = []
    try:
        for idx, info in storage_data.items():
            problem = _item_problem(idx, info, manifest)
            if problem is None and getattr(idx, "fqn", None) not in declared:
                problem = f"item {getattr(idx, 'fqn', idx)!r} belongs to no declared name"
            if problem:
                problems.append(problem)
        problems += _declared_problems(metadata, storage_data)
    except (AttributeError, TypeError, ValueError, RuntimeError) as exc:  # records of the wrong shape
        problems.append(f"malformed metadata: {type(exc).__name__}: {exc}")
    return problems


def index_block_problems(index: RankIndex) -> list[tuple[str, str]]:
    """(fqn, why) for every item of ``index`` whose checksum blocks a reader refuses
    (:func:`~ckptio.format.blocks.block_layout_problem`)."""
    found = ((it.fqn, block_layout_problem(it.block_size, it.checked_span()[1])) for it in index.items)
    return [(fqn, why) for fqn, why in found if why is not None]


def index_findings(metadata: Any, manifest: Manifest, indexes: dict[int, RankIndex]) -> tuple[list[str], list[str]]:
    """(problems, warnings) between the rank indexes of this step's save and the manifest and ``.metadata``.

    An index of another attempt (save_id), a missing index, or an index whose files differ from the manifest is a
    warning: the manifest is the commit record, and indexes are what the ranks said before it. Where a current
    index agrees with the manifest, ``.metadata`` must place its items exactly where the index does: a
    disagreement there is a problem (values would restore under the wrong names).
    """
    from torch.distributed.checkpoint.metadata import MetadataIndex

    problems: list[str] = []
    warnings: list[str] = []
    storage_data = getattr(metadata, "storage_data", None) if metadata is not None else None
    for rank in range(manifest.world_size):
        index = indexes.get(rank)
        if index is None:
            warnings.append(f"ranks/{rank}.json: missing or unreadable")
            continue
        if (index.rank, index.step, index.save_id, index.world_size) != (
                rank, manifest.step, manifest.save_id, manifest.world_size):
            warnings.append(f"ranks/{rank}.json: describes rank {index.rank} step {index.step} save "
                            f"{index.save_id:x} of {index.world_size}, not this manifest's save {manifest.save_id:x}")
            continue
        differs = [f.name for f in index.files if manifest.files.get(f.name) != f]
        if differs:
            warnings.append(f"ranks/{rank}.json: files {differs} differ from the manifest")
            continue
        problems += [f"ranks/{rank}.json: item {fqn!r}: {why}" for fqn, why in index_block_problems(index)]
        if not isinstance(storage_data, dict):
            continue
        for it in index.items:
            info = storage_data.get(MetadataIndex(it.fqn, it.offset, it.index_hint))
            placed = (getattr(info, "relative_path", None), getattr(info, "offset", None),
                      getattr(info, "length", None))
            if placed != (it.file, it.file_offset, it.length):
                problems.append(f".metadata places {it.fqn!r} at {placed}, rank {rank} wrote it at "
                                f"{(it.file, it.file_offset, it.length)}")
    stray = sorted(set(indexes) - set(range(manifest.world_size)))
    warnings += [f"ranks/{r}.json: no such rank in a world of {manifest.world_size}" for r in stray]
    return problems, warnings
