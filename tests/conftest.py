"""Session-wide fixtures. Per-area fixtures live in each test folder's own conftest.py.

The S3 fixtures start one real S3-protocol server (moto) for the whole session on 127.0.0.1 and a free port
(a fixed port deadlocks under xdist), put fake credentials in the environment so every boto3 client of the
session (and of the processes it spawns) talks to it, and create buckets in given regions, public or private.

A second, independent S3 implementation, s3rver (npm; installed by ``make s3rver``), is started on first use for
the rest of the session: a store that ignores conditional writes and has no public-access or region API. Tests
that use it skip only where Node.js is absent; where Node.js is present and s3rver is not installed they fail,
saying how to install it.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# A shell starts a background job (`make test &`) with SIGINT ignored, and an ignored signal stays ignored in every
# process spawned from here: the Ctrl-C tests would then see their job finish instead of stop. A Python handler
# resets to the default in exec'd children, so Ctrl-C reaches them however the suite was launched.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The session packs many jobs on few cores: a writer at its default nice 10 gets a tenth of a core's share beside
# the other workers' busy ranks and a test waiting on it takes 5-10x as long (a save measured 46 s against 10 s at
# nice 0 beside three busy loops). Every process of the session inherits this; a test of the default unsets it.
os.environ.setdefault("CKPTIO_WRITER_NICE", "0")

# The shipped storage conformance kit is a pytest plugin (its spawn_pool fixture serves tests/storage).
pytest_plugins = ["ckptio.testing.conformance"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the tests' ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs ``--dist loadgroup``), tests that share an expensive fixture go to one
    worker, which builds it once: every cluster-lab test (the lab's namespaces, daemons and shaped links are shared,
    and two labs at once would each measure the other's load), and the tests of a module that share a module- or
    class-scoped fixture (a module's CLI runs, an interop module's checkpoints). Every other test goes to whichever
    worker is free."""
    for item in items:
        if item.get_closest_marker("lab") is not None:
            item.add_marker(pytest.mark.xdist_group("lab"))
        elif _shares_a_scoped_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _shares_a_scoped_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the item's fixtures (no public accessor)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "class") for defs in info.name2fixturedefs.values())


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of the session's moto S3 server; AWS_ENDPOINT_URL and fake credentials are set while it runs.

    The same embedded server ``ckptio demo --store s3`` runs (its own bucket is simply one more bucket here).
    """
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from ckptio.testing.moto_s3 import embedded_s3

    with embedded_s3() as url:
        yield url


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Any:
    """A plain boto3 client on the session server, for setting buckets up and looking behind ckptio's back."""
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


_bucket_numbers = itertools.count()


def _public_read_policy(bucket: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "PublicRead",
                    "Effect": "Allow",
                    "Principal": "*",
                    "Action": "s3:GetObject",
                    "Resource": f"arn:aws:s3:::{bucket}/*",
                }
            ],
        }
    )


@pytest.fixture(scope="session")
def make_bucket(s3_endpoint: str) -> Callable[..., str]:
    """``make_bucket(region="us-east-1", public=None|"policy"|"acl", block_public=True) -> name``.

    Private buckets get a full public-access block, as AWS creates them today. Public ones have the block
    removed and either a public-read bucket policy or a ``public-read`` ACL (moto does not enforce
    BlockPublicPolicy, so the order of these calls does not matter to it; it would on AWS).
    """
    import boto3

    def make(region: str = "us-east-1", *, public: str | None = None, block_public: bool = True) -> str:
        name = f"ckptio-test-{next(_bucket_numbers)}-{os.getpid()}"
        client = boto3.client("s3", endpoint_url=s3_endpoint, region_name=region)
        create: dict[str, Any] = {"Bucket": name}
        if region != "us-east-1":
            create["CreateBucketConfiguration"] = {"LocationConstraint": region}
        client.create_bucket(**create)
        if block_public and public is None:
            flags = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
            client.put_public_access_block(
                Bucket=name, PublicAccessBlockConfiguration=dict.fromkeys(flags, True)
            )
        if public == "policy":
            client.put_bucket_policy(Bucket=name, Policy=_public_read_policy(name))
        elif public == "acl":
            client.put_bucket_acl(Bucket=name, ACL="public-read")
        elif public is not None:
            raise ValueError(f"public must be None, 'policy' or 'acl', not {public!r}")
        return name

    return make


@pytest.fixture
def s3_bucket(make_bucket: Callable[..., str]) -> str:
    """A fresh private bucket in us-east-1."""
    return make_bucket()


@pytest.fixture(scope="session")
def s3rver_endpoint(s3_endpoint: str) -> Iterator[str]:
    """URL of the session's s3rver (127.0.0.1, a free port, a temp directory, silent; any credentials).

    Depends on ``s3_endpoint`` for the fake credentials in the environment (s3rver accepts any); clients of
    s3rver name its endpoint explicitly, since AWS_ENDPOINT_URL points at moto.
    """
    from ckptio.testing.s3rver_s3 import node_missing_reason, run_s3rver

    reason = node_missing_reason()
    if reason:
        pytest.skip(reason)
    with run_s3rver() as url:
        yield url


@pytest.fixture(scope="session")
def make_s3rver_bucket(s3rver_endpoint: str) -> Callable[[], str]:
    """``make_s3rver_bucket() -> name``: a fresh bucket on the session's s3rver."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3rver_endpoint, region_name="us-east-1")

    def make() -> str:
        name = f"ckptio-s3rver-{next(_bucket_numbers)}-{os.getpid()}"
        client.create_bucket(Bucket=name)
        return name

    return make
