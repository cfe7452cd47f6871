"""`ckptio probe` and `ckptio admit` check residency and the store's capabilities before writing anything, on two
real S3 implementations: the session's moto server (everything honoured) and s3rver (conditional writes ignored,
no public-access or region API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from ckptio._cli.main import main
from ckptio.plan.admit import admit
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import shape_checkpoint
from ckptio.plan.job.presets import PRESETS
from ckptio.storage.capabilities import ALL_CAPABILITIES, detect_capabilities
from ckptio.storage.s3.s3_storage import S3Storage

pytestmark = pytest.mark.s3

_SMALL_PROBE = ["--writers", "1", "--file-size", "1MiB", "--files-per-writer", "1", "--small-files", "8",
                "--max-seconds", "5"]
_ADMIT = ["admit", "--params", "50M", "--ranks", "2", "--interval", "10m", "--probe", "--probe-seconds", "5"]


def _keys(endpoint: str | None, bucket: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_probe_refuses_a_public_bucket_before_writing(
    make_bucket: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = make_bucket(public="acl")
    assert main(["probe", f"s3://{bucket}/p", *_SMALL_PROBE]) == 1
    assert "public" in capsys.readouterr().err
    assert _keys(None, bucket) == []
    assert main(["probe", f"s3://{bucket}/p", *_SMALL_PROBE, "--allow-public", "--json"]) == 0
    assert _keys(None, bucket) == []  # the probe cleans up


def test_probe_reports_every_capability_of_moto(s3_bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", f"s3://{s3_bucket}/p", *_SMALL_PROBE, "--json"]) == 0
    caps = json.loads(capsys.readouterr().out)["capabilities"]
    assert {name: caps[name]["ok"] for name in ALL_CAPABILITIES} == dict.fromkeys(ALL_CAPABILITIES, True)


def test_probe_reports_what_s3rver_lacks(
    make_s3rver_bucket: Callable[[], str], s3rver_endpoint: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3rver_endpoint)  # the CLI reads the standard chain
    bucket = make_s3rver_bucket()
    assert main(["probe", f"s3://{bucket}/p", *_SMALL_PROBE]) == 1  # no API says whether it is public
    assert "store_private=True" in capsys.readouterr().err
    assert _keys(s3rver_endpoint, bucket) == []
    assert main(["probe", f"s3://{bucket}/p", *_SMALL_PROBE, "--store-private", "--json"]) == 0
    caps = json.loads(capsys.readouterr().out)["capabilities"]
    assert {name: caps[name]["ok"] for name in ALL_CAPABILITIES} == {
        "conditional_create": False, "compare_and_swap": False, "multipart": True, "ranged_get": True,
        "public_access_api": False, "region_api": False,
    }
    assert "replaced the object" in caps["conditional_create"]["detail"]
    assert main(["probe", f"s3://{bucket}/p", *_SMALL_PROBE, "--store-private"]) == 0
    text = capsys.readouterr().out
    assert "conditional create" in text and "NO" in text and 'commit="lease"' in text
    assert _keys(s3rver_endpoint, bucket) == []


def test_admit_probe_refuses_a_public_bucket_without_writing(
    make_bucket: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = make_bucket(public="policy")
    assert main([*_ADMIT, "--root", f"s3://{bucket}/run", "--json"]) == 1
    decision = json.loads(capsys.readouterr().out)
    assert not decision["admitted"] and decision["reasons"][0].startswith("residency:")
    assert _keys(None, bucket) == [], "admit --probe wrote into a public bucket"


def test_admit_refuses_a_store_without_conditional_writes_unless_lease(
    make_s3rver_bucket: Callable[[], str], s3rver_endpoint: str
) -> None:
    storage: Any = S3Storage(make_s3rver_bucket(), "run", endpoint_url=s3rver_endpoint)
    caps = detect_capabilities(storage)
    budget = plan_burst(shape_checkpoint(PRESETS["mlperf-llama3-8b"].spec()),
                        StoreLimits(write_bytes_per_s=10 * 2**30, kind="object"), Schedule(interval_s=3600))
    refused = admit(budget, capabilities=caps)
    assert any(r.startswith("store:") and "conditional writes" in r for r in refused.reasons)
    assert refused.capabilities is not None and refused.capabilities["conditional_create"]["ok"] is False
    lease = admit(budget, capabilities=caps, commit="lease")
    assert not any(r.startswith("store:") for r in lease.reasons)
