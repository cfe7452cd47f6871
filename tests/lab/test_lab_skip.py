"""Where the lab cannot run, a lab test skips and says why (this runs everywhere: no lab is started)."""

from __future__ import annotations

import pytest

from ckptio.testing.cluster import Lab, LabConfig, LabUnavailable, checks
from ckptio.testing.cluster import lab as lab_module
from ckptio.testing.cluster.checks import reason
from tests.lab.conftest import start_lab


def test_an_unavailable_lab_raises_its_reason_and_the_fixture_skips_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab_module, "reason", lambda pfs, s3: "the cluster lab needs root (for this test)")
    with pytest.raises(LabUnavailable, match="needs root"):
        Lab(LabConfig(nodes=1))
    with pytest.raises(pytest.skip.Exception, match="cluster lab unavailable: the cluster lab needs root"):
        start_lab(LabConfig(nodes=1))


def test_unknown_stores_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "platform_reason", lambda: None)  # as on a machine that can run the lab
    monkeypatch.setattr(checks, "fuse_usable", lambda: True)
    assert reason("lustre", "auto") == "unknown parallel filesystem 'lustre' (moosefs, glusterfs or none)"
    assert reason("none", "minio") == "unknown S3 server 'minio' (seaweedfs, moto, auto or none)"
