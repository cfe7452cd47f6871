"""S3Storage against s3rver, a second S3 implementation that ignores If-None-Match/If-Match and has no
public-access or region API: the conformance suite runs with the capabilities s3rver declares, and the
capability probe must find exactly those (a real server, started by the session; see tests/conftest.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from ckptio.storage import Storage
from ckptio.storage.capabilities import MULTIPART, RANGED_GET
from ckptio.storage.s3.s3_storage import MiB, S3Storage
from ckptio.testing.conformance import StoreTests

pytestmark = pytest.mark.s3

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def suite_bucket(make_s3rver_bucket: Callable[[], str]) -> str:
    return make_s3rver_bucket()


class TestS3rver(StoreTests):
    large_size = 11 * MiB
    capabilities = frozenset({MULTIPART, RANGED_GET})

    @pytest.fixture
    def storage(self, suite_bucket: str, s3rver_endpoint: str) -> Iterator[Storage]:
        store = S3Storage(suite_bucket, f"run/{next(_prefixes)}", endpoint_url=s3rver_endpoint,
                          multipart_threshold=1 * MiB, max_concurrency=4, retry_base_s=0.01)
        yield store
        store.close()

    @pytest.mark.skip(reason="s3rver writes an object's file in place: a concurrent GET can see a partial body "
                             "(seen here); AWS, MinIO and moto replace objects atomically")
    def test_reader_never_sees_a_partial_object(self, storage: Storage) -> None:  # type: ignore[override]
        raise AssertionError("skipped")

    @pytest.mark.xfail(strict=True, reason="s3rver's delimiter listing drops a common prefix whose objects all lie "
                                           "two or more levels down (a/b/c lists no 'a' unless a/x exists); AWS "
                                           "and moto list it")
    def test_list_dirs_lists_one_level_of_names(self, storage: Storage) -> None:  # type: ignore[override]
        super().test_list_dirs_lists_one_level_of_names(storage)
