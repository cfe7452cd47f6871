"""The engine on an S3 root (real moto server): round trips on 1 and 2 ranks, object counts, DCP reader, faults in
front of the server, and residency refusing before any object is written. Racing committers and hash-prefixed
keys under retention are held in one process by tests/engine/writer/test_s3_commits.py."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
from ckptio._cli.main import main as cli
from ckptio.errors import ResidencyError
from ckptio.storage import open_storage
from tests.engine.engine_workers import model_state, run_ranks
from tests.storage.fault_proxy import Fault, FaultProxy

pytestmark = pytest.mark.s3


def _keys(s3_client, bucket: str, prefix: str = "") -> list[str]:
    out = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in out.get("Contents", []))


def test_round_trip_ls_verify_and_dcp_reader(s3_bucket, s3_client, capsys):
    root = f"s3://{s3_bucket}/run1"
    state = model_state(3)
    state["info"] = {"step": 10, "tag": "s3"}
    with ckptio.Checkpointer(root, keep_last=2) as ck:
        for step in (10, 20, 30):
            ck.save(step, state).wait(timeout=120)
        target = {**model_state(0), "info": {"step": 0, "tag": ""}}
        assert ck.restore(target) == 30
    for key in ("w", "b", "emb"):
        assert torch.equal(target[key], state[key])
    assert target["info"] == {"step": 10, "tag": "s3"}
    keys = _keys(s3_client, s3_bucket, "run1/")
    assert "run1/step-00000030/manifest.json" in keys and "run1/latest" in keys
    assert not any(k.startswith("run1/step-00000010/") for k in keys), "retention on S3"
    capsys.readouterr()
    assert cli(["ls", root, "--json"]) == 0
    assert [s["step"] for s in json.loads(capsys.readouterr().out)["steps"]] == [20, 30]
    assert cli(["verify", root]) == 0
    # torch.distributed.checkpoint.load through ckptio's StorageReader.
    target = model_state(0)
    reader = ckptio.CkptioStorageReader(open_storage(root), 30)
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(target, storage_reader=reader)
    assert torch.equal(target["w"], state["w"])


def test_objects_per_rank_for_two_thousand_tiny_tensors(s3_bucket, s3_client):
    state = {f"t{i}": torch.full((8,), float(i)) for i in range(2000)}
    nbytes = sum(t.nbytes for t in state.values())
    with ckptio.Checkpointer(f"s3://{s3_bucket}/tiny") as ck:
        ck.save(1, state).wait(timeout=120)
    rank_objects = [k for k in _keys(s3_client, s3_bucket, "tiny/step-00000001/")
                    if k.endswith(".distcp") or "/ranks/" in k]
    part_size = 16 << 20
    assert len(rank_objects) <= math.ceil(nbytes / part_size) + 2, rank_objects


def _two_rank_s3(rank: int, world_size: int, root: str, out: str) -> None:
    state = model_state(7 + rank)  # different per rank: replicated keys deduplicate to rank 0's copy
    state["mine"] = {f"r{rank}": torch.full((16,), float(rank))}
    with ckptio.Checkpointer(root) as ck:
        ck.save(5, state).wait(timeout=300)
        target = model_state(0)
        target["mine"] = {f"r{rank}": torch.zeros(16)}
        step = ck.restore(target)
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump({"step": step, "mine_ok": bool(torch.equal(target["mine"][f"r{rank}"],
                                                             torch.full((16,), float(rank))))}, f)


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_ranks_on_s3(s3_bucket, s3_client, tmp_path):
    run_ranks(2, _two_rank_s3, f"s3://{s3_bucket}/two", str(tmp_path))
    for r in range(2):
        with open(tmp_path / f"{r}.json") as f:
            assert json.load(f) == {"step": 5, "mine_ok": True}
    keys = _keys(s3_client, s3_bucket, "two/step-00000005/")
    assert "two/step-00000005/ranks/0.json" in keys and "two/step-00000005/ranks/1.json" in keys


def test_faults_in_front_of_the_server_still_commit(s3_bucket, s3_endpoint):
    proxy = FaultProxy(s3_endpoint)
    try:
        proxy.add(Fault(kind="slowdown", every=3, method="PUT"))
        proxy.add(Fault(kind="error500", every=4, method="GET"))
        proxy.add(Fault(kind="drop_response", every=5, method="PUT", limit=2))
        root = f"s3://{s3_bucket}/faulty"
        opts = {"endpoint_url": proxy.url, "retry_base_s": 0.01, "retry_cap_s": 0.05}
        state = {"w": torch.randn(512, 512)}
        with ckptio.Checkpointer(root, storage_options=opts) as ck:
            for step in (1, 2):
                ck.save(step, state).wait(timeout=120)
            target = {"w": torch.zeros(512, 512)}
            assert ck.restore(target) == 2
        assert torch.equal(target["w"], state["w"])
        assert sum(f.injected for f in proxy.faults) >= 3
    finally:
        proxy.close()


def test_failing_store_leaves_the_previous_step_intact(s3_bucket, s3_endpoint):
    proxy = FaultProxy(s3_endpoint)
    root = f"s3://{s3_bucket}/broken"
    opts = {"endpoint_url": proxy.url, "retry_base_s": 0.01, "retry_cap_s": 0.02, "max_attempts": 2}
    try:
        with ckptio.Checkpointer(root, storage_options=opts) as ck:
            ck.save(1, {"w": torch.ones(256)}).wait(timeout=120)
            proxy.add(Fault(kind="error500", every=1, method="PUT", path_contains="step-00000002"))
            h = ck.save(2, {"w": torch.zeros(256)})
            with pytest.raises(ckptio.errors.StorageError):
                h.wait(timeout=120)
            assert ck.latest_step() == 1
            target = {"w": torch.zeros(256)}
            assert ck.restore(target) == 1
        assert torch.equal(target["w"], torch.ones(256))
    finally:
        proxy.close()


@pytest.mark.parametrize("setup", ["public_policy", "public_acl", "wrong_region"])
def test_residency_refuses_before_any_object_is_written(make_bucket, s3_client, setup):
    if setup == "wrong_region":
        bucket = make_bucket("eu-west-1")
        residency = ckptio.Residency(allowed_regions=["us-east-1"])
    else:
        bucket = make_bucket("us-east-1", public="policy" if setup == "public_policy" else "acl",
                             block_public=False)
        residency = ckptio.Residency()
    with pytest.raises(ResidencyError, match=bucket):
        ckptio.Checkpointer(f"s3://{bucket}/run", residency=residency)
    assert _keys(s3_client, bucket) == []
