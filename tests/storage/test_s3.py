"""S3Storage passes the conformance suite against the session's moto server; plus S3-only behaviour."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ckptio.errors import ConfigError, NotFoundError, StorageError
from ckptio.storage import Storage, open_storage
from ckptio.storage.s3 import MiB, S3Storage, choose_part_size, hashed_key
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
