"""ckptio and plain DCP, both directions, on real gloo ranks and real files (issue 23; ``make interop``).

* plain ``dcp.save`` (``FileSystemWriter`` with 1 and 3 threads, ZStandard, a user's Rot13 extension) → ckptio's
  reader, at other world sizes and layouts;
* ckptio's ``Checkpointer.save`` → plain ``dcp.load`` (``FileSystemReader``) and ``format_utils.dcp_to_torch_save``;
* row-wise ↔ column-wise resharding (2 ranks → 3), DTensor ↔ plain tensor, one tensor under two keys, objects
  beside tensors; an unknown extension is a named error; a ShardedTensor is refused on save, read on load.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ckptio.testing.ranks import run_ranks
from tests.interop import interop_ranks as ir

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.interop]


def _reports(out: str, tag: str, world: int) -> dict:
    merged: dict = {}
    for r in range(world):
        with open(os.path.join(out, f"{tag}-r{r}.json")) as f:
            for case, rep in json.load(f).items():
                merged.setdefault(case, []).append(rep)
    return merged


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints written once for the module: plain DCP at 2 ranks (1 thread; 3 threads + ZStandard), plain DCP
    with Rot13 at 1 rank, ckptio at 2 ranks (row-wise) and at 1 rank (a plain tensor)."""
    base = tmp_path_factory.mktemp("interop")
    paths = {"dcp1": str(base / "dcp1"), "dcp3z": str(base / "dcp3z"), "rot13": str(base / "rot13"),
             "ck": str(base / "ck"), "ckplain": str(base / "ckplain")}
    run_ranks(2, ir.save_dcp, paths["dcp1"], 1, None)
    run_ranks(2, ir.save_dcp, paths["dcp3z"], 3, "zstd")
    run_ranks(1, ir.save_dcp, paths["rot13"], 1, "rot13")
    run_ranks(2, ir.save_ckptio, paths["ck"], "rows")
    run_ranks(1, ir.save_ckptio, paths["ckplain"], "plain")
    return base, paths


def test_each_direction_at_other_world_sizes_and_layouts(saved, tmp_path):
    _, p = saved
    ck, ckplain = p["ck"] + "/step-00000001", p["ckplain"] + "/step-00000001"
    one = [["ckptio", p["dcp1"], "plain"], ["ckptio", p["dcp3z"], "plain"], ["ckptio", p["rot13"], "plain"],
           ["ckptio", ck, "plain"], ["dcp", ck, "plain"]]
    three = [["ckptio", p["dcp1"], "cols"], ["ckptio", p["dcp3z"], "cols"], ["ckptio", ck, "cols"],
             ["dcp", ck, "cols"]]
    two = [["ckptio", ckplain, "rows"], ["dcp", ckplain, "rows"], ["ckptio", ck, "cols"], ["dcp", ck, "cols"]]
    out = str(tmp_path)
    run_ranks(1, ir.load_cases, one, out, "one")
    run_ranks(3, ir.load_cases, three, out, "three")
    run_ranks(2, ir.load_cases, two, out, "two")
    for tag, world in (("one", 1), ("three", 3), ("two", 2)):
        for case, reps in _reports(out, tag, world).items():
            assert all(r["ok"] for r in reps), (tag, case, reps)
    # ckptio's checkpoint through DCP's own converter: one torch.save file of the whole state.
    dcp_to_torch_save(ck, str(tmp_path / "whole.pt"))
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert torch.equal(whole["w"], ir.full()) and whole["obj"] == {"lr": 0.1, "tags": ["a", "b"]}
    assert torch.equal(whole["s1"], torch.arange(10.0)) and torch.equal(whole["s2"], torch.arange(10.0))


def _without_registry(rank: int, world: int, path: str, out: str) -> None:
    from ckptio import CkptioStorageReader
    from ckptio.storage import open_storage

    target = ir.state("plain", blank=True)
    try:
        import torch.distributed.checkpoint as dcp

        dcp.load(target, storage_reader=CkptioStorageReader(open_storage(path), None))
        report = {"error": None}
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        cause = next(iter(exc.failures.values())) if hasattr(exc, "failures") else exc
        cause = cause[0] if isinstance(cause, tuple) else cause
        report = {"error": type(cause).__name__, "message": str(cause)}
    with open(os.path.join(out, "unknown.json"), "w") as f:
        json.dump(report, f)


def test_an_extension_the_reader_does_not_know_is_named(saved, tmp_path):
    _, p = saved
    run_ranks(1, _without_registry, p["rot13"], str(tmp_path))
    with open(tmp_path / "unknown.json") as f:
        report = json.load(f)
    assert report["error"] == "UnknownExtensionError" and "stream.rot13" in report["message"], report


def test_a_sharded_tensor_is_refused_on_save_and_read_on_load(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_ranks(2, ir.sharded_tensor, str(tmp_path), str(out))
    for r in range(2):
        with open(out / f"sharded-r{r}.json") as f:
            report = json.load(f)
        refused = report["refused"]
        assert refused and refused["error"] == "UnsupportedStateError", report
        assert all(word in refused["message"] for word in ("ShardedTensor", "DTensor", "'st'")), report
        assert report["read"], report
