"""The on-storage contract: keys, rank index, manifest, ``latest``, layout, retention and verification.

No processes and no collectives live here, and nothing here imports the engine: every function takes a
:class:`~ckptio.storage.Storage` and reads or writes the format through it. The engine, the CLI and the tools
all speak the format through these names.
"""

from __future__ import annotations

from ckptio.format.commit import (
    all_step_dirs,
    committed_steps,
    newest_committed_step,
    read_failure_markers,
    read_failures,
    read_latest,
    read_manifest,
    update_latest,
    write_failure,
    write_manifest,
)
from ckptio.format.keys import (
    LATEST,
    MANIFEST,
    METADATA,
    durable_data_key,
    failed_key,
    hash_prefix_enabled,
    index_key,
    manifest_key,
    parse_step_dir,
    step_dir,
)
from ckptio.format.records import FileRecord, ItemRecord, Manifest, RankIndex, checksum, record_key, versions
from ckptio.format.retention import apply_retention, delete_step, remove_unlisted_files
from ckptio.format.verify import VerifyResult, check_file, verify_levels, verify_local_step, verify_step

__all__ = [
    "LATEST",
    "MANIFEST",
    "METADATA",
    "FileRecord",
    "ItemRecord",
    "Manifest",
    "RankIndex",
    "VerifyResult",
    "all_step_dirs",
    "apply_retention",
    "check_file",
    "checksum",
    "committed_steps",
    "delete_step",
    "durable_data_key",
    "failed_key",
    "hash_prefix_enabled",
    "index_key",
    "manifest_key",
    "newest_committed_step",
    "parse_step_dir",
    "read_failure_markers",
    "read_failures",
    "read_latest",
    "read_manifest",
    "record_key",
    "remove_unlisted_files",
    "step_dir",
    "update_latest",
    "verify_levels",
    "verify_local_step",
    "verify_step",
    "versions",
    "write_failure",
    "write_manifest",
]
