"""Claims are checked before memory is spent: records forged by whoever can write the root (a manifest and
``.metadata`` that say a 4 MiB file holds 2 GiB, a rank index of 1-byte checksum blocks) are refused as
``CorruptCheckpointError`` before restore allocates by them, and ``ckptio verify`` names them too."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import crc32c
import torch

import ckptio
from ckptio.errors import CorruptCheckpointError
from ckptio.format import verify_step
from ckptio.format.blocks import MIN_BLOCK_SIZE
from ckptio.storage import open_storage
from tests.format.tamper import data_file, load_manifest, load_metadata, save_manifest, step_path, write_metadata

CLAIM = 2 << 30


def _save(root: str, state: dict) -> None:
    with ckptio.Checkpointer(root, volume_check="off") as ck:
        ck.save(1, state).wait(timeout=120)


def _claim_two_gib(root: str) -> None:
    """The manifest says the data file holds 2 GiB, and ``.metadata`` (checksum fixed) stretches the object item to
    the end of that claim, so every cross-check between the records still passes."""
    name = os.path.basename(data_file(root, 1))
    body = load_manifest(root, 1)
    body["files"][name]["size"] = CLAIM
    save_manifest(root, 1, body)
    metadata = load_metadata(root, 1)
    for idx, info in metadata.storage_data.items():
        if idx.fqn == "obj.a":
            info.length = CLAIM - info.offset
    write_metadata(root, 1, pickle.dumps(metadata))


_LIMITED = textwrap.dedent("""
    import json, resource, sys, torch
    from ckptio.engine.restore.context import RestoreContext
    from ckptio.engine.restore.step_restore import restore_step
    from ckptio.engine.side_group import SideGroup
    from ckptio.storage import open_storage

    target = {"w": torch.zeros(1 << 20), "obj": {"a": 0}}
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    # No room for the claim: allocating it, even lazily, raises MemoryError.
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
    try:
        restore_step(RestoreContext(open_storage(sys.argv[1]), SideGroup()), target)
        print(json.dumps({"raised": None}))
    except Exception as exc:
        print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
""")


def test_a_size_claim_beyond_the_real_file_is_refused_before_it_is_allocated(root):
    _save(root, {"w": torch.ones(1 << 20), "obj": {"a": 1}})  # a 4 MiB file
    _claim_two_gib(root)
    out = subprocess.run([sys.executable, "-c", _LIMITED, root], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["raised"] == "CorruptCheckpointError", report
    assert f"holds {CLAIM} bytes, the store holds" in report["message"], report


def _one_byte_blocks(root: str) -> None:
    """Rank 0's index claims 1-byte checksum blocks for the tensor, each one's crc32c correct."""
    index_path = step_path(root, 1, "ranks", "0.json")
    with open(index_path) as f:
        index = json.load(f)
    (item,) = [i for i in index["items"] if i["fqn"] == "w"]
    with open(data_file(root, 1), "rb") as f:
        f.seek(item["file_offset"] + item["data_offset"])
        raw = f.read(item["data_length"])
    item["block_size"] = 1
    item["crc32c"] = "".join(f"{crc32c.crc32c(raw[i:i + 1]):08x}" for i in range(len(raw)))
    with open(index_path, "w") as f:
        json.dump(index, f)


def test_one_byte_checksum_blocks_are_refused_as_corrupt(root):
    _save(root, {"w": torch.ones(1 << 16)})  # 256 KiB
    _one_byte_blocks(root)
    try:
        with ckptio.Checkpointer(root, volume_check="off") as ck:
            ck.restore({"w": torch.zeros(1 << 16)})
        raised = None
    except CorruptCheckpointError as exc:
        raised = exc
    assert raised is not None and f"below the minimum of {MIN_BLOCK_SIZE}" in str(raised), raised
    result = verify_step(open_storage(root), 1)
    assert not result.ok and any("checksum blocks of 1 bytes" in p for p in result.problems), result
