"""What a checkpoint root names: the one parser of root strings (plain paths, ``file://`` URLs, ``s3://`` URLs).

Everything that is handed a root as text — :func:`ckptio.storage.open_storage`, the volume checks, the planner's
probe and admission gate — asks :func:`parse_root` instead of looking at prefixes itself.

* A plain path is a directory, taken as written (relative paths stay relative).
* ``file:`` URLs follow RFC 8089: the path is percent-decoded (``file:///a%20b`` is the directory ``/a b``), the
  host may be empty or ``localhost``, and any other host is refused (this process cannot write there).
* ``s3://bucket/prefix`` names a bucket and a key prefix. The prefix is taken literally, as the AWS CLI does:
  S3 keys may contain ``%``, ``?`` and ``#``.
* Any other scheme is a :class:`~ckptio.errors.ConfigError`.

This module never touches a filesystem or the network.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

from ckptio.errors import ConfigError

__all__ = ["PosixRoot", "RootSpec", "S3Root", "parse_root"]

# RFC 3986 scheme, then "://": "C:/x" or "run:3" are not URLs; "gs://b" is one this library does not speak.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_LOCAL_HOSTS = ("", "localhost")


@dataclass(frozen=True, slots=True)
class PosixRoot:
    """A directory (absolute, or relative to the current directory)."""

    path: str


@dataclass(frozen=True, slots=True)
class S3Root:
    """A key prefix (no leading or trailing ``/``; empty for the whole bucket) in an S3 bucket."""

    bucket: str
    prefix: str = ""


RootSpec = PosixRoot | S3Root


def parse_root(target: str | os.PathLike[str] | RootSpec) -> RootSpec:
    """The root ``target`` names; :class:`~ckptio.errors.ConfigError` when it names none this library can use."""
    if isinstance(target, (PosixRoot, S3Root)):
        return target
    text = os.fspath(target)
    if not text:
        raise ConfigError("empty storage path")
    if text.lower().startswith("file:"):
        return PosixRoot(_file_url_path(text))
    match = _URL.match(text)
    if match is None:
        return PosixRoot(text)
    if match.group(1).lower() == "s3":
        return _s3_root(text, text[match.end() :])
    raise ConfigError(f"unsupported storage URL {text!r} (use a path, file://, or s3://)")


def _file_url_path(url: str) -> str:
    """The local path of a ``file:`` URL per RFC 8089 (``file:///p``, ``file://localhost/p``, ``file:/p``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc.lower() not in _LOCAL_HOSTS:
        raise ConfigError(
            f"{url!r} names the host {parts.netloc!r}: only local file:// URLs can be roots "
            "(file:///path or file://localhost/path); mount the filesystem and give its local path"
        )
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ConfigError(f"{url!r} has a query or fragment: percent-encode '?' and '#' in file:// paths")
    if not parts.path.startswith("/"):
        raise ConfigError(f"{url!r} has no absolute path (use file:///absolute/path)")
    # Percent-decoding to bytes then fsdecode inverts pathlib's as_uri, even for names that are not UTF-8.
    return os.fsdecode(urllib.parse.unquote_to_bytes(parts.path))


def _s3_root(url: str, rest: str) -> S3Root:
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{url!r} names no bucket (use s3://bucket/prefix)")
    return S3Root(bucket, prefix.strip("/"))
