"""The torch floor in pyproject.toml is the oldest release that has every torch API ckptio uses.

Only one torch is installed for a test run, so the history is a table: for each name ckptio imports from a torch
submodule, the first release that has it, read from the release wheels (``torch/distributed/checkpoint/*.py`` of
2.6.0, 2.7.0, 2.8.0 and 2.9.0). Every such import in ``src/`` must be in the table, so whoever imports a new torch
name has to date it, and the floor must cover the newest date. torch 2.9.0 was then installed and the round-trip,
format, two-level, multi-rank and demo tests passed on it; 2.8.0 lacks ``CURRENT_DCP_VERSION``, so
``ckptio.engine.trainer.rank_plan`` does not even import there.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
OLDEST_READ = "2.6"
"""The oldest release read: a name dated so was there in 2.6.0, perhaps long before."""

# (module, name) -> the first torch release that has it.
TORCH_API_SINCE: dict[tuple[str, str], str] = {
    # .metadata: the DCP format version ckptio writes (``Metadata.version`` arrived with it).
    ("torch.distributed.checkpoint.filesystem", "CURRENT_DCP_VERSION"): "2.9",
    # The demo's DCP-best saver: async staging into shared memory, its own staging and upload futures.
    ("torch.distributed.checkpoint.staging", "DefaultStager"): "2.9",
    ("torch.distributed.checkpoint.staging", "StagingOptions"): "2.9",
    ("torch.distributed.checkpoint.state_dict_saver", "AsyncSaveResponse"): "2.9",  # used, not imported
    ("torch.distributed.checkpoint.state_dict_saver", "AsyncCheckpointerType"): "2.7",
    # Stream extensions named in a .metadata (pytorch PR 143358, January 2025): read only to refuse them by name.
    ("torch.distributed.checkpoint._extension", "ExtensionRegistry"): "2.7",
    ("torch.distributed.checkpoint._extension", "StreamTransformExtension"): "2.7",
    ("torch.distributed._shard._utils", "narrow_tensor_by_index"): OLDEST_READ,
    ("torch.distributed._shard.sharded_tensor", "ShardedTensor"): OLDEST_READ,
    ("torch.distributed.checkpoint", "FileSystemWriter"): OLDEST_READ,
    ("torch.distributed.checkpoint._traverse", "set_element"): OLDEST_READ,
    ("torch.distributed.checkpoint.api", "CheckpointException"): OLDEST_READ,
    ("torch.distributed.checkpoint.default_planner", "DefaultLoadPlanner"): OLDEST_READ,
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner"): OLDEST_READ,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): OLDEST_READ,
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"): OLDEST_READ,
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"): OLDEST_READ,
    ("torch.distributed.checkpoint.metadata", "Metadata"): OLDEST_READ,
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"): OLDEST_READ,
    ("torch.distributed.checkpoint.metadata", "StorageMeta"): OLDEST_READ,
    ("torch.distributed.checkpoint.metadata", "TensorProperties"): OLDEST_READ,
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "LoadItemType"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "LoadPlan"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "LoadPlanner"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "ReadItem"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "SavePlan"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "SavePlanner"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "WriteItem"): OLDEST_READ,
    ("torch.distributed.checkpoint.planner", "WriteItemType"): OLDEST_READ,
    ("torch.distributed.checkpoint.state_dict", "StateDictOptions"): OLDEST_READ,
    ("torch.distributed.checkpoint.state_dict", "get_model_state_dict"): OLDEST_READ,
    ("torch.distributed.checkpoint.state_dict", "get_state_dict"): OLDEST_READ,
    ("torch.distributed.checkpoint.state_dict", "set_model_state_dict"): OLDEST_READ,
    ("torch.distributed.checkpoint.state_dict", "set_state_dict"): OLDEST_READ,
    ("torch.distributed.checkpoint.stateful", "Stateful"): OLDEST_READ,
    ("torch.distributed.checkpoint.storage", "StorageReader"): OLDEST_READ,
    ("torch.distributed.checkpoint.storage", "WriteResult"): OLDEST_READ,
    ("torch.distributed.device_mesh", "DeviceMesh"): OLDEST_READ,
    ("torch.distributed.device_mesh", "init_device_mesh"): OLDEST_READ,
    ("torch.distributed.tensor", "DTensor"): OLDEST_READ,
    ("torch.distributed.tensor", "Shard"): OLDEST_READ,
    ("torch.futures", "Future"): OLDEST_READ,
}


def torch_imports(src: Path = ROOT / "src") -> set[tuple[str, str]]:
    """Every ``from torch.<module> import <name>`` under ``src`` (``from torch import nn`` names a module)."""
    found = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("torch."):
                found |= {(node.module or "", alias.name) for alias in node.names}
    return found


def torch_floor(pyproject: Path = ROOT / "pyproject.toml") -> Version:
    tomllib = pytest.importorskip("tomllib")
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (torch,) = [Requirement(d) for d in dependencies if Requirement(d).name == "torch"]
    floors = [Version(s.version) for s in torch.specifier if s.operator == ">="]
    assert len(floors) == 1, f"torch needs exactly one >= bound: {torch}"
    return floors[0]


def test_every_torch_import_is_dated():
    undated = sorted(torch_imports() - set(TORCH_API_SINCE))
    assert not undated, f"date these in TORCH_API_SINCE (the first torch release that has them): {undated}"


def test_the_floor_covers_every_api():
    newest = max(TORCH_API_SINCE.values(), key=Version)
    assert torch_floor() >= Version(newest), f"pyproject's torch floor is below {newest}, which ckptio needs"


@pytest.mark.parametrize(("module", "name"), sorted(TORCH_API_SINCE))
def test_every_dated_api_exists(module, name):
    # Holds the table to the torch installed here: a misspelt or stale entry cannot date anything.
    assert hasattr(importlib.import_module(module), name)


def test_the_checker_finds_imports(tmp_path):
    (tmp_path / "m.py").write_text("import torch\nfrom torch import nn\n"
                                   "def f():\n    from torch.distributed.tensor import DTensor, Shard\n")
    assert torch_imports(tmp_path) == {("torch.distributed.tensor", "DTensor"), ("torch.distributed.tensor", "Shard")}
