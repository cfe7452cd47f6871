"""S3Storage passes the conformance suite against the session's moto server; plus S3-only behaviour."""

from __future__ import annotations

import hashlib
import itertools
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import crc32c
import pytest

from ckptio.errors import ConfigError, NotFoundError, StorageError
from ckptio.storage import Storage, open_storage
from ckptio.storage.s3.parts import FileSlice, SegmentReader, encode_crc32c
from ckptio.storage.s3.s3_storage import MiB, S3Storage, choose_part_size, hashed_key
from ckptio.testing.conformance import StoreTests

pytestmark = pytest.mark.s3

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def suite_bucket(make_bucket: Callable[..., str]) -> str:
    return make_bucket("eu-central-1")


class TestS3(StoreTests):
    # Three 5 MiB-class parts with the 1 MiB threshold below: the multipart path runs in every "large" test (and
    # the 4 MiB read parts make ranged reads of them concurrent GETs).
    large_size = 11 * MiB

    @pytest.fixture
    def storage(self, suite_bucket: str) -> Iterator[Storage]:
        # Endpoint and credentials come from the environment (AWS_ENDPOINT_URL): tests the standard chain.
        store = S3Storage(
            suite_bucket,
            f"run/{next(_prefixes)}",
            multipart_threshold=1 * MiB,
            read_part_size=4 * MiB,
            max_concurrency=4,
            retry_base_s=0.01,
        )
        yield store
        store.close()


def test_from_url_and_options(s3_endpoint: str, s3_bucket: str) -> None:
    store = open_storage(f"s3://{s3_bucket}/deep/prefix/", endpoint_url=s3_endpoint, region="us-east-1")
    assert isinstance(store, S3Storage)
    assert (store.bucket, store.prefix, store.url) == (
        s3_bucket,
        "deep/prefix",
        f"s3://{s3_bucket}/deep/prefix",
    )
    store.put("k", b"v")
    assert store.get("k") == b"v"
    bare = S3Storage.from_url(f"s3://{s3_bucket}")
    assert bare.get("deep/prefix/k") == b"v"
    assert [i.key for i in bare.list("deep/")] == ["deep/prefix/k"]


@pytest.mark.parametrize(
    "url, options",
    [
        ("s3:///nobucket", {}),
        ("http://x/y", {}),
        ("s3://b", {"part_size": 1}),
        ("s3://b", {"read_part_size": 1024}),
        ("s3://b", {"colour": "red"}),
        ("s3://b", {"max_attempts": 0}),
        ("s3://b", {"addressing_style": "sideways"}),
    ],
)
def test_bad_configuration_is_a_config_error(url: str, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        S3Storage.from_url(url, **options)


def test_bucket_region_is_read_from_head_bucket(make_bucket: Callable[..., str]) -> None:
    # The client signs for us-east-1; the region reported is the bucket's own.
    store = S3Storage(make_bucket("ap-southeast-2"), region="us-east-1")
    assert store.region == "ap-southeast-2"
    assert pickle.loads(pickle.dumps(store)).region == "ap-southeast-2"


def test_missing_bucket_is_a_storage_error_not_a_missing_key(s3_endpoint: str) -> None:
    store = S3Storage("ckptio-no-such-bucket", max_attempts=1)
    with pytest.raises(StorageError) as info:
        store.get("k")
    assert not isinstance(info.value, NotFoundError)
    assert "does not exist" in str(info.value)


def test_pickle_carries_settings_not_clients(s3_bucket: str) -> None:
    store = S3Storage(s3_bucket, "p", max_concurrency=3, part_size=8 * MiB)
    store.put("x", b"1")  # opens the client
    state = store.__getstate__()
    assert set(state) == {"bucket", "prefix", "options", "bucket_region"}
    clone = pickle.loads(pickle.dumps(store))
    assert clone.options == store.options
    assert clone.get("x") == b"1"


def test_multipart_layout(s3_bucket: str, s3_client: Any) -> None:
    store = S3Storage(s3_bucket, "mp", part_size=5 * MiB, multipart_threshold=5 * MiB)
    payload = bytes(range(256)) * (48 * 1024)  # 12 MiB
    info = store.put("obj", [payload[:100], payload[100:]])
    assert info.etag.endswith("-3")  # three parts: 5 + 5 + 2 MiB
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert store.get("obj") == payload


def test_part_size_rules() -> None:
    assert choose_part_size(100 * MiB) == 16 * MiB
    assert choose_part_size(10 << 30) == 64 * MiB  # multi-GB objects: >= 64 MiB parts
    huge = 5 << 40  # 5 TiB: 10,000 parts at most
    assert -(-huge // choose_part_size(huge)) <= 10_000
    assert choose_part_size(100 * MiB, 5 * MiB) == 5 * MiB
    assert choose_part_size(1 << 40, 5 * MiB) >= (1 << 40) // 10_000


def test_conditional_write_token_is_stored(s3_bucket: str, s3_client: Any) -> None:
    store = S3Storage(s3_bucket, "tok")
    store.put("m", b"x", mode="create")
    head = s3_client.head_object(Bucket=s3_bucket, Key="tok/m")
    assert len(head["Metadata"]["ckptio-write"]) == 16


def test_hashed_key_spreads_ranks() -> None:
    keys = [hashed_key(f"step-00000100/__{rank}_0.distcp") for rank in range(64)]
    assert all(k.startswith("h-") and k.endswith(f"__{r}_0.distcp") for r, k in enumerate(keys))
    assert len({k.split("/", 1)[0] for k in keys}) > 32
    assert hashed_key("a/b") == hashed_key("a/b")


def _sent_requests(store: S3Storage) -> list[tuple[str, dict[str, list[str]], dict[str, str]]]:
    """(method, query, headers) of every request the store's client sends from now on."""
    sent: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []

    def record(request: Any, **_: Any) -> None:
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        sent.append((request.method, parse_qs(urlsplit(request.url).query, keep_blank_values=True), headers))

    store.client.meta.events.register("before-send.s3", record)
    return sent


def test_uploads_carry_their_crc32c_and_skip_the_payload_hash(s3_bucket: str, s3_client: Any) -> None:
    # Each body goes out with the CRC32C of exactly its bytes (S3 verifies it before storing them) and
    # unsigned: no SHA-256 pass over the body, which botocore would otherwise make over plain http.
    store = S3Storage(s3_bucket, "crc", part_size=5 * MiB, multipart_threshold=5 * MiB)
    sent = _sent_requests(store)
    payload = os.urandom(12 * MiB)
    store.put("big", [memoryview(payload)[:100], memoryview(payload)[100:]], mode="create")
    store.put("small", b"rank index")
    create = [h for m, q, h in sent if m == "POST" and "uploads" in q]
    parts = {int(q["partNumber"][0]): h for m, q, h in sent if m == "PUT" and "partNumber" in q}
    single = [h for m, q, h in sent if m == "PUT" and "partNumber" not in q]
    assert [h["x-amz-checksum-algorithm"] for h in create] == ["CRC32C"]  # the parts' checksums are declared
    assert sorted(parts) == [1, 2, 3]
    for number, headers in parts.items():
        expected = payload[(number - 1) * 5 * MiB : number * 5 * MiB]
        assert headers["x-amz-checksum-crc32c"] == encode_crc32c(crc32c.crc32c(expected))
    assert single[0]["x-amz-checksum-crc32c"] == encode_crc32c(crc32c.crc32c(b"rank index"))
    assert {h["x-amz-content-sha256"] for h in [*parts.values(), *single]} == {"UNSIGNED-PAYLOAD"}
    # The store keeps the checksums: the single PUT's as sent, the multipart one built from its parts'.
    head = s3_client.head_object(Bucket=s3_bucket, Key="crc/small", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == encode_crc32c(crc32c.crc32c(b"rank index"))
    attrs = s3_client.get_object_attributes(Bucket=s3_bucket, Key="crc/big", ObjectAttributes=["Checksum"])
    assert "ChecksumCRC32C" in attrs["Checksum"]
    assert store.get("big") == payload


def test_sign_payload_hashes_the_body_into_the_signature(s3_bucket: str) -> None:
    store = S3Storage(s3_bucket, "signed", sign_payload=True)
    sent = _sent_requests(store)
    store.put("small", b"rank index")
    (headers,) = [h for m, _, h in sent if m == "PUT"]
    assert headers["x-amz-content-sha256"] == hashlib.sha256(b"rank index").hexdigest()
    assert headers["x-amz-checksum-crc32c"] == encode_crc32c(crc32c.crc32c(b"rank index"))
    assert store.get("small") == b"rank index"


def test_part_readers_checksum_their_own_bytes(tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 5)
    view = memoryview(data)
    segments = SegmentReader([view[:10], view[10 : 2 * MiB], view[2 * MiB :]])
    segments.read(100)  # the checksum covers every byte, wherever the reader stands
    assert segments.crc32c() == crc32c.crc32c(data)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert FileSlice(fd, MiB, 2 * MiB + 1).crc32c() == crc32c.crc32c(data[MiB : 3 * MiB + 1])
        with pytest.raises(StorageError, match="short"):  # the file shrank under its upload
            FileSlice(fd, 3 * MiB, MiB).crc32c()
    finally:
        os.close(fd)


def test_a_store_that_refuses_checksum_headers_gets_none(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The AWS chain's setting for such stores: ckptio sends no CRC32C then, and signs each body as botocore would.
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    store = S3Storage(s3_bucket, "plain", part_size=5 * MiB, multipart_threshold=5 * MiB)
    sent = _sent_requests(store)
    payload = os.urandom(11 * MiB)
    store.put("big", payload)
    store.put("small", b"rank index")
    assert not [h for _, _, h in sent if any(k.startswith("x-amz-checksum") for k in h)]
    (single,) = [h for m, q, h in sent if m == "PUT" and "partNumber" not in q]
    assert single["x-amz-content-sha256"] == hashlib.sha256(b"rank index").hexdigest()
    assert store.get("big") == payload


def test_a_pacer_is_asked_for_every_part_before_it_goes(s3_bucket: str, tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.taken: list[int] = []

        def take(self, nbytes: int) -> None:
            self.taken.append(nbytes)

    store = S3Storage(s3_bucket, "paced", part_size=5 * MiB, multipart_threshold=5 * MiB)
    payload = os.urandom(12 * MiB)
    path = tmp_path / "data.bin"
    path.write_bytes(payload)
    buffers, file, single = Recorder(), Recorder(), Recorder()
    store.put("big", payload, pacer=buffers)
    store.put_file("file", str(path), pacer=file)
    store.put("small", b"rank index", pacer=single)
    assert sorted(buffers.taken) == sorted(file.taken) == [2 * MiB, 5 * MiB, 5 * MiB]
    assert single.taken == [len(b"rank index")]
    assert store.get("big") == store.get("file") == payload
