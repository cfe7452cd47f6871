"""Restore's pickles are read with allowlists: a crafted ``.metadata`` or value never runs its payload."""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import pickle

import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata

from ckptio.errors import CorruptCheckpointError, UntrustedCheckpointError
from ckptio.format.safe_pickle import load_metadata, load_object
from tests.format.tamper import MakeDirPayload, step_path


@dataclasses.dataclass
class Hyper:
    lr: float
    tags: list[str]


def _torch_save(value: object) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def test_real_metadata_loads_with_the_allowlist(pristine_root):
    with open(step_path(pristine_root, 2, ".metadata"), "rb") as f:
        raw = f.read()
    restricted = load_metadata(raw)
    assert isinstance(restricted, Metadata)
    assert restricted == pickle.loads(raw)  # what DCP itself would have read, byte for byte the same objects


def test_every_dtype_and_layout_a_tensor_can_have_is_admitted():
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8, torch.bool,
              torch.complex64, torch.float8_e4m3fn]
    sd = {f"t{i}": TensorStorageMetadata(TensorProperties(dtype=d), torch.Size([2]),
                                         [ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))])
          for i, d in enumerate(dtypes)}
    md = Metadata(state_dict_metadata=sd, planner_data={"t0": ("t0",)}, storage_data={})
    assert load_metadata(pickle.dumps(md)) == md


@pytest.mark.parametrize("where", ["planner_data", "storage_meta", "top"])
def test_crafted_metadata_payload_never_runs(tmp_path, where):
    marker = str(tmp_path / "RAN")
    md = Metadata(state_dict_metadata={}, planner_data={})
    payload = MakeDirPayload(marker)
    if where == "planner_data":
        md.planner_data = {"x": payload}
    elif where == "storage_meta":
        md.storage_meta = payload  # type: ignore[assignment]
    raw = pickle.dumps(payload if where == "top" else md)
    with pytest.raises(UntrustedCheckpointError, match=r"os\.makedirs|posix\.makedirs"):
        load_metadata(raw, path="step-00000001/.metadata")
    assert not os.path.exists(marker)


def test_metadata_that_is_not_metadata_or_not_a_pickle_is_corrupt():
    with pytest.raises(CorruptCheckpointError, match="not DCP Metadata"):
        load_metadata(pickle.dumps({"a": 1}))
    with pytest.raises(CorruptCheckpointError, match="unreadable"):
        load_metadata(b"\x80\x05garbage")


def test_values_load_with_weights_only_semantics_and_an_allowlist(tmp_path):
    marker = str(tmp_path / "RAN")
    with pytest.raises(UntrustedCheckpointError, match="makedirs"):
        load_object(_torch_save({"a": MakeDirPayload(marker)}), path="opt")
    assert not os.path.exists(marker)

    plain = {"step": 3, "betas": (0.9, 0.99), "t": torch.ones(2), "s": "x"}
    loaded = load_object(_torch_save(plain))
    assert loaded["betas"] == (0.9, 0.99) and torch.equal(loaded["t"], torch.ones(2))

    blob = _torch_save(Hyper(lr=0.1, tags=["a"]))
    with pytest.raises(UntrustedCheckpointError, match="Hyper"):
        load_object(blob, path="hyper")
    assert load_object(blob, safe_globals=[Hyper]) == Hyper(lr=0.1, tags=["a"])
    assert load_object(blob, trust_pickles=True) == Hyper(lr=0.1, tags=["a"])  # the explicit opt-in


def test_damaged_value_is_corrupt_not_untrusted():
    with pytest.raises(CorruptCheckpointError) as info:
        load_object(b"not a torch.save blob", path="lr")
    assert not isinstance(info.value, UntrustedCheckpointError)


def _plain_dcp_metadata(tmp_path) -> bytes:
    import torch.distributed.checkpoint as dcp

    path = tmp_path / "plain"
    dcp.save({"w": torch.ones(3), "o": {"a": 1}}, checkpoint_id=str(path))  # FileSystemWriter, torch 2.13
    return (path / ".metadata").read_bytes()


def test_dcp_metadata_holding_the_checkpoint_path_loads_as_plain_data(tmp_path):
    raw = _plain_dcp_metadata(tmp_path)
    assert b"pathlib" in raw  # torch 2.13's FileSystemWriter records the directory as a PosixPath
    metadata = load_metadata(raw)
    assert metadata.storage_meta.checkpoint_id == pathlib.PurePosixPath(str(tmp_path / "plain"))
    assert type(metadata.storage_meta.checkpoint_id) is pathlib.PurePosixPath  # built from strings, not PosixPath


def test_metadata_as_an_older_torch_on_another_python_writes_it_loads_too(tmp_path):
    """Built by hand (torch 2.9 is not installed here): the torch 2.13 metadata without its ``version`` field
    (torch 2.9's Metadata pickles no more than that), in protocol 2, with the path class under ``pathlib._local``,
    where Python 3.13 keeps it, and a Windows path beside it."""
    metadata = pickle.loads(_plain_dcp_metadata(tmp_path))  # the test wrote this file
    metadata.__dict__.pop("version", None)
    metadata.storage_meta.modules = [pathlib.PureWindowsPath("C:/ckpt/step-1")]
    raw = pickle.dumps(metadata, protocol=2)
    assert b"cpathlib\nPosixPath\n" in raw
    raw = raw.replace(b"cpathlib\nPosixPath\n", b"cpathlib._local\nPosixPath\n")
    loaded = load_metadata(raw)
    assert loaded.storage_meta.checkpoint_id == pathlib.PurePosixPath(str(tmp_path / "plain"))
    assert loaded.storage_meta.modules == [pathlib.PureWindowsPath("C:/ckpt/step-1")]
    assert loaded.state_dict_metadata == metadata.state_dict_metadata


def test_a_pickled_path_holding_anything_but_strings_is_refused():
    raw = b"\x80\x02cpathlib\nPosixPath\nK\x01\x85R."  # PosixPath(1)
    with pytest.raises(UntrustedCheckpointError, match="not strings"):
        load_metadata(raw)
