"""The storage conformance kit on the lab's real distributed stores: a POSIX root on the MooseFS mount (node 0's
FUSE client, across its shaped link) and S3 on SeaweedFS (through the host's loopback forwarder and node 0's link).

The kit's cross-process tests spawn their workers from this (host) process: they see the same mount and the same
forwarder, so they are clients of the same store too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptio.storage import Storage, open_storage
from ckptio.storage.capabilities import ALL_CAPABILITIES, PUBLIC_ACCESS_API, REGION_API
from ckptio.testing.cluster import Lab
from ckptio.testing.conformance import StoreTests

pytestmark = pytest.mark.lab

MiB = 1 << 20
_prefixes = itertools.count()


class TestMooseFSMount(StoreTests):
    @pytest.fixture
    def storage(self, pfs_root: Path) -> Storage:
        return open_storage(str(pfs_root), fsync=True)


class TestSeaweedS3(StoreTests):
    # SeaweedFS answers neither the public-access block API nor HeadBucket's region header: the probe must say so.
    capabilities = frozenset(ALL_CAPABILITIES) - {PUBLIC_ACCESS_API, REGION_API}
    # Three parts with the 5 MiB threshold below, so the multipart path runs in every "large" test.
    large_size = 11 * MiB

    @pytest.fixture
    def storage(self, lab: Lab, lab_s3_env: str) -> Iterator[Storage]:
        assert lab.s3 is not None
        store = open_storage(f"s3://{lab_s3_env}/conformance/{next(_prefixes)}", endpoint_url=lab.s3.host_url,
                             multipart_threshold=1 * MiB, read_part_size=4 * MiB, max_concurrency=4,
                             retry_base_s=0.01)
        yield store
        store.close()
