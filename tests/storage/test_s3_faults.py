"""S3Storage through a fault-injecting proxy: transient failures are retried; permanent ones leave no half.

Every test talks to the real moto server through ``fault_proxy.FaultProxy``; nothing is mocked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from ckptio.errors import AlreadyExistsError, StorageError
from ckptio.storage import IfMatch
from ckptio.storage.s3.s3_storage import MiB, S3Storage
from tests.storage.fault_proxy import Fault, FaultProxy

pytestmark = pytest.mark.s3


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    server = FaultProxy(s3_endpoint)
    yield server
    server.close()


@pytest.fixture
def store(proxy: FaultProxy, s3_bucket: str) -> S3Storage:
    return S3Storage(
        s3_bucket,
        "ckpt",
        endpoint_url=proxy.url,
        part_size=5 * MiB,
        multipart_threshold=5 * MiB,
        read_part_size=8 * MiB,
        max_concurrency=3,
        max_attempts=6,
        retry_base_s=0.001,
        retry_cap_s=0.01,
    )


def _no_open_uploads(s3_client: Any, bucket: str) -> bool:
    return s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


@pytest.mark.parametrize("kind", ["slowdown", "error500", "drop_request", "conflict409"])
def test_transient_put_failures_are_retried(
    kind: str, proxy: FaultProxy, store: S3Storage, s3_client: Any
) -> None:
    # At most 4 faults against 6 attempts: a request cannot run out of attempts, however threads interleave.
    fault = proxy.add(Fault(kind=kind, every=2, limit=4))  # type: ignore[arg-type]
    large = os.urandom(12 * MiB)  # three parts, so UploadPart meets the fault too
    store.put("step-1/__0_0.distcp", [large[:1000], large[1000:]])
    for i in range(4):
        store.put(f"step-1/ranks/{i}.json", f"rank {i}".encode())
    store.put("step-1/manifest.json", b"{}", mode="create")
    assert fault.injected >= 3  # 3 parts + Create/Complete + 5 PUTs: 10 PUTs, every second one faulted
    assert store.stats["retries"] >= fault.injected
    assert store.get("step-1/__0_0.distcp") == large
    assert [store.get(f"step-1/ranks/{i}.json") for i in range(4)] == [f"rank {i}".encode() for i in range(4)]
    assert _no_open_uploads(s3_client, store.bucket)


def test_reads_and_listings_are_retried(proxy: FaultProxy, store: S3Storage) -> None:
    for i in range(5):
        store.put(f"k/{i}", bytes([i]) * 100)
    for method in ("GET", "HEAD"):
        proxy.add(Fault(kind="error500", method=method, every=2, limit=2))
    proxy.add(Fault(kind="drop_request", method="GET", every=3, limit=2))
    assert store.get_many([f"k/{i}" for i in range(5)]) == {f"k/{i}": bytes([i]) * 100 for i in range(5)}
    assert sorted(i.key for i in store.list("k/")) == [f"k/{i}" for i in range(5)]
    assert store.head("k/3").size == 100
    assert store.list_dirs() == ["k"]


def test_ranged_reads_into_buffers_are_retried(proxy: FaultProxy, store: S3Storage) -> None:
    payload = os.urandom(20 << 20)  # three ranged GETs of at most 8 MiB
    store.put("big", payload)
    proxy.add(Fault(kind="error500", method="GET", every=2, limit=1))
    proxy.add(Fault(kind="drop_request", method="GET", every=3, limit=1))
    cut = proxy.add(Fault(kind="truncate_response", method="GET", path_contains="big", limit=2))
    retries = store.stats["retries"]
    out = bytearray(len(payload) - 5)
    assert store.readinto("big", [memoryview(out)[:1000], memoryview(out)[1000:]], offset=5) == len(out)
    assert bytes(out) == payload[5:]
    assert cut.injected == 2 and store.stats["retries"] - retries >= 4


def test_create_only_recognises_its_own_write_after_a_lost_answer(
    proxy: FaultProxy, store: S3Storage
) -> None:
    # The PUT reaches S3, the answer is lost; the retry meets 412 for the object it wrote itself.
    fault = proxy.add(Fault(kind="drop_response", path_contains="manifest.json", limit=1))
    info = store.put("step-2/manifest.json", b'{"step": 2}', mode="create")
    assert fault.injected == 1
    assert info.size == len(b'{"step": 2}')
    assert store.get("step-2/manifest.json") == b'{"step": 2}'
    with pytest.raises(AlreadyExistsError):  # a real second committer still loses
        store.put("step-2/manifest.json", b'{"step": 2, "other": 1}', mode="create")


def test_create_only_multipart_complete_answer_lost(
    proxy: FaultProxy, store: S3Storage, s3_client: Any
) -> None:
    fault = proxy.add(Fault(kind="drop_response", method="POST", query_contains="uploadId=", limit=1))
    payload = os.urandom(11 * MiB)
    store.put("big", payload, mode="create")
    assert fault.injected == 1
    assert store.get("big") == payload
    assert _no_open_uploads(s3_client, store.bucket)


def test_if_match_recognises_its_own_swap_after_a_lost_answer(proxy: FaultProxy, store: S3Storage) -> None:
    first = store.put("latest", b"100")
    proxy.add(Fault(kind="drop_response", path_contains="latest", limit=1))
    store.put("latest", b"200", mode=IfMatch(first.etag))
    assert store.get("latest") == b"200"


def test_a_part_that_always_fails_aborts_the_upload(
    proxy: FaultProxy, store: S3Storage, s3_client: Any
) -> None:
    store.put("step-1/__0_0.distcp", b"previous step")
    proxy.add(Fault(kind="error500", query_contains="partNumber=2"))
    with pytest.raises(StorageError) as info:
        store.put("step-2/__0_0.distcp", os.urandom(12 * MiB))
    assert "InternalError" in str(info.value)
    assert not store.exists("step-2/__0_0.distcp")
    assert _no_open_uploads(s3_client, store.bucket)
    assert store.get("step-1/__0_0.distcp") == b"previous step"


def test_a_put_that_always_drops_leaves_nothing(proxy: FaultProxy, store: S3Storage) -> None:
    proxy.add(Fault(kind="drop_request", path_contains="ranks/0.json"))
    with pytest.raises(StorageError):
        store.put("step-1/ranks/0.json", b"x" * 1000)
    assert not store.exists("step-1/ranks/0.json")
    assert store.stats["retries"] == store.options.max_attempts - 1


def test_put_file_streams_through_faults(proxy: FaultProxy, store: S3Storage, tmp_path: Any) -> None:
    proxy.add(Fault(kind="slowdown", every=2, limit=4))
    path = tmp_path / "data.bin"
    payload = os.urandom(13 * MiB)
    path.write_bytes(payload)
    store.put_file("file", str(path), mode="create")
    assert store.get("file") == payload


@pytest.mark.parametrize("source", ["buffers", "file"])
def test_a_body_corrupted_in_flight_is_refused_and_sent_again(
    source: str, proxy: FaultProxy, store: S3Storage, s3_client: Any, tmp_path: Any
) -> None:
    # The store checks each body against the CRC32C ckptio sent (the proxy does, as S3 does; moto does not):
    # a flipped bit is a 400 BadDigest, retried from the intact bytes; the flipped bytes are never stored.
    part = proxy.add(Fault(kind="corrupt_body", query_contains="partNumber=2", limit=2))
    single = proxy.add(Fault(kind="corrupt_body", path_contains="ranks/0.json", limit=1))
    payload = os.urandom(12 * MiB)
    if source == "file":
        path = tmp_path / "data.bin"
        path.write_bytes(payload)
        store.put_file("step-1/__0_0.distcp", str(path), mode="create")
    else:
        store.put("step-1/__0_0.distcp", [payload[:7], payload[7:]], mode="create")
    store.put("step-1/ranks/0.json", b'{"rank": 0}')
    assert (part.injected, single.injected) == (2, 1)
    assert store.stats["retries"] == 3
    assert store.get("step-1/__0_0.distcp") == payload
    assert store.get("step-1/ranks/0.json") == b'{"rank": 0}'
    assert _no_open_uploads(s3_client, store.bucket)


def test_a_body_that_never_matches_its_checksum_is_not_stored(
    proxy: FaultProxy, store: S3Storage, s3_client: Any
) -> None:
    proxy.add(Fault(kind="corrupt_body", query_contains="partNumber=3"))
    with pytest.raises(StorageError, match="BadDigest"):
        store.put("step-1/__0_0.distcp", os.urandom(12 * MiB))
    assert store.stats["retries"] == store.options.max_attempts - 1
    assert not store.exists("step-1/__0_0.distcp")
    assert _no_open_uploads(s3_client, store.bucket)
