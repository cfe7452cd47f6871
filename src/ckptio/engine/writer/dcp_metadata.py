"""The DCP ``.metadata`` of a committed step: the plan's skeleton completed with where every item landed.

Only rank 0's committer builds it, and only this module of the writer imports torch (DCP's metadata classes):
the other ranks' writers never load it.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta

from ckptio.format import RankIndex


def build_metadata(skeleton: Metadata, indexes: Sequence[RankIndex], checkpoint_id: str) -> Metadata:
    """Complete DCP's global metadata with where every item landed (``storage_data``)."""
    storage_data: dict[MetadataIndex, _StorageInfo] = {}
    for index in indexes:
        for it in index.items:
            key = MetadataIndex(it.fqn, it.offset, it.index_hint)
            storage_data[key] = _StorageInfo(it.file, it.file_offset, it.length)
    return Metadata(
        state_dict_metadata=skeleton.state_dict_metadata,
        planner_data=skeleton.planner_data,
        storage_data=storage_data,
        storage_meta=StorageMeta(checkpoint_id=checkpoint_id),
        version=CURRENT_DCP_VERSION,
    )
