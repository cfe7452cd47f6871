"""S3 roots: ``s3://bucket/prefix`` names a bucket and a key prefix in it.

The prefix is taken literally, as the AWS CLI does: S3 keys may contain ``%``, ``?`` and ``#``. Never touches the
network, and imports nothing of boto3: the registry parses every root with it, whether or not S3 is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptio.errors import ConfigError
from ckptio.storage.root import Root

__all__ = ["S3Root", "parse_s3_url"]


@dataclass(frozen=True, slots=True)
class S3Root(Root):
    """A key prefix (no leading or trailing ``/``; empty for the whole bucket) in an S3 bucket."""

    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_s3_url(url: str) -> S3Root:
    """The bucket and prefix of ``s3://bucket/prefix`` (any case of the scheme)."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{url!r} names no bucket (use s3://bucket/prefix)")
    return S3Root(bucket, prefix.strip("/"))
