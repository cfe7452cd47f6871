"""Where a step's items lie and which checksums cover them, as the restore's coordinator sees it — with every claim
the records make checked before any memory is spent on it.

The records are DCP's ``.metadata`` (where each item lies: file, offset, length), the manifest (each file's size and
crc32c) and the rank indexes (each item's raw bytes and block checksums). They are written by whoever can write the
root, so a reader holds them to what is really there before it allocates by them:

* a file's size in the manifest must be the object's real size (``head``): the byte ranges of ``.metadata`` were
  already held inside the manifest's sizes (:mod:`ckptio.format.crosscheck`), so no buffer a restore allocates —
  a gathered item, a file read whole — is ever larger than bytes that exist;
* checksum blocks below :data:`~ckptio.format.blocks.MIN_BLOCK_SIZE` or above
  :data:`~ckptio.format.blocks.MAX_BLOCKS` per item are refused as corrupt: each costs a plan entry and a crc call;
* an index of another save, or one whose files differ from the manifest, is ignored (its files are read whole and
  checked with the manifest's crc32c), as is an item record that disagrees with ``.metadata`` or with the chunk's
  shape.

Pure reads and arithmetic: no collectives, no targets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

from ckptio.engine.restore.read_plan import ChunkShape, Place, StoreLayout, item_blocks
from ckptio.errors import CorruptCheckpointError, StorageError
from ckptio.format import FileRecord, ItemRecord, Manifest, RankIndex, record_key, step_dir
from ckptio.format.blocks import Block
from ckptio.format.crosscheck import index_block_problems
from ckptio.storage.base import ReadStore, join_key

_POOL = 16
"""Concurrent record reads and heads (a store's latency, not its bandwidth, is what they wait on)."""


def chunk_shapes(metadata: Metadata) -> dict[MetadataIndex, ChunkShape]:
    """Every stored tensor chunk's shape and dtype, by its index."""
    shapes = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            size = torch.empty((), dtype=md.properties.dtype).element_size()
            for chunk in md.chunks:
                shapes[MetadataIndex(fqn, chunk.offsets)] = ChunkShape(tuple(chunk.sizes), size, md.properties.dtype)
    return shapes


def read_item_records(storage: ReadStore, manifest: Manifest, index_key: Callable[[int], str]) -> dict[Any, ItemRecord]:
    """The item records of the rank indexes that belong to ``manifest``'s save, by DCP index. Indexes of another
    save or with other files are left out (their files are read whole); one whose blocks a reader refuses is
    :class:`~ckptio.errors.CorruptCheckpointError`."""

    def read(rank: int) -> RankIndex | None:
        key = index_key(rank)
        try:
            index = RankIndex.from_json(storage.get(key), key=key)
        except (StorageError, CorruptCheckpointError):
            return None
        files = manifest.files
        if (index.step, index.save_id, index.rank) != (manifest.step, manifest.save_id, rank) or any(
                f.name not in files or (files[f.name].size, files[f.name].crc32c) != (f.size, f.crc32c)
                for f in index.files):
            return None
        refused = index_block_problems(index)
        if refused:
            fqn, why = refused[0]
            raise CorruptCheckpointError(f"rank index claims {why} for {fqn!r}", root=storage.url, step=manifest.step,
                                         path=key)
        return index

    ranks = range(manifest.world_size)
    with ThreadPoolExecutor(max(1, min(_POOL, len(ranks))), thread_name_prefix="ckptio-index") as pool:
        indexes = list(pool.map(read, ranks))
    return {MetadataIndex(it.fqn, it.offset, it.index_hint): it
            for index in indexes if index is not None for it in index.items}


def _usable(records: dict[Any, ItemRecord], shapes: dict[MetadataIndex, ChunkShape],
            storage_data: dict[Any, Any]) -> dict[str, bool]:
    """Per file: whether every item in it has block checksums that agree with ``.metadata`` and its chunk."""
    usable: dict[str, bool] = {}
    for idx, info in storage_data.items():
        rec = records.get(idx)
        ok = (rec is not None and rec.has_blocks()
              and (rec.file, rec.file_offset, rec.length) == (info.relative_path, info.offset, info.length))
        if ok and rec is not None and rec.data_offset is not None:  # raw bytes: they must be the chunk's
            shape = shapes.get(idx)
            ok = shape is not None and rec.data_length == shape.nbytes
        usable[info.relative_path] = usable.get(info.relative_path, True) and ok
    return usable


def build_layout(storage_data: dict[Any, Any], records: dict[Any, ItemRecord],
                 shapes: dict[MetadataIndex, ChunkShape], files: dict[str, FileRecord]) -> StoreLayout:
    """Places and blocks of every item; a file any of whose items lacks usable block checksums is read whole."""
    usable = _usable(records, shapes, storage_data)
    layout = StoreLayout()
    for idx, info in storage_data.items():
        name = info.relative_path
        if not usable[name]:
            layout.whole_files[name] = files[name]
            layout.places[idx] = Place(name, info.offset, info.length)
            continue
        rec = records[idx]
        # Bytes stored through a DCP stream extension are not the tensor's: they are gathered and decoded.
        raw = None if rec.data_offset is None or getattr(info, "transform_descriptors", None) else (
            info.offset + rec.data_offset)
        layout.places[idx] = Place(name, info.offset, info.length, raw)
        layout.blocks[idx] = item_blocks(rec)
    return layout


def build_plain_layout(storage_data: dict[Any, Any]) -> StoreLayout:
    """The layout of a plain DCP checkpoint: each item is read on its own (its range, never the whole file), as one
    block without a crc32c: what vouches for its bytes is the zip CRC-32 torch.save recorded inside it, checked once
    the item is gathered (DCP records no checksum of its own)."""
    layout = StoreLayout()
    for idx, info in storage_data.items():
        layout.places[idx] = Place(info.relative_path, info.offset, info.length)
        layout.blocks[idx] = [Block(info.offset, info.length, "", idx.fqn)] if info.length else []
    return layout


def check_real_sizes(storage: ReadStore, manifest: Manifest, names: Iterable[str]) -> None:
    """:class:`~ckptio.errors.CorruptCheckpointError` unless each of ``names`` has, on ``storage``, the size the
    manifest records (a missing file is left to the read, which names it)."""

    def problem(name: str) -> CorruptCheckpointError | None:
        rec = manifest.files[name]
        try:
            real = storage.head(record_key(manifest.step, rec)).size
        except StorageError:
            return None
        if real == rec.size:
            return None
        return CorruptCheckpointError(f"the manifest says {name} holds {rec.size} bytes, the store holds {real}",
                                      root=storage.url, step=manifest.step,
                                      path=join_key(step_dir(manifest.step), name))

    names = sorted(set(names))
    with ThreadPoolExecutor(max(1, min(_POOL, len(names))), thread_name_prefix="ckptio-head") as pool:
        found = [p for p in pool.map(problem, names) if p is not None]
    if found:
        raise found[0]
