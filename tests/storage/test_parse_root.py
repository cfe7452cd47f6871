"""parse_root: the one reader of root strings (plain paths, file:// per RFC 8089, s3://), and its users."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import ckptio
from ckptio.errors import ConfigError
from ckptio.policy.volumes import check_volumes, volume_of
from ckptio.storage import PosixRoot, PosixStorage, open_storage, parse_root
from ckptio.storage.s3.s3_root import S3Root


@pytest.mark.parametrize(
    "text, path",
    [
        ("/data/ckpt", "/data/ckpt"),
        ("relative/dir", "relative/dir"),
        ("/data/a b", "/data/a b"),  # a plain path is taken as written, spaces and percent signs included
        ("/data/100%25", "/data/100%25"),
        ("/data/x://y", "/data/x://y"),  # "://" inside a path does not make it a URL
        ("file:///data/ckpt", "/data/ckpt"),
        ("file:///tmp/a%20b", "/tmp/a b"),
        ("file:///tmp/100%2525", "/tmp/100%25"),
        ("file:///tmp/caf%C3%A9", "/tmp/café"),
        ("file://localhost/x", "/x"),
        ("file://LOCALHOST/x", "/x"),
        ("file:/x/y", "/x/y"),  # RFC 8089's minimal form
        ("FILE:///x", "/x"),  # schemes are case-insensitive
    ],
)
def test_posix_roots(text: str, path: str) -> None:
    assert parse_root(text) == PosixRoot(path)


def test_path_like_and_parsed_roots_pass_through(tmp_path: Path) -> None:
    assert parse_root(tmp_path / "a b") == PosixRoot(str(tmp_path / "a b"))
    spec = S3Root("bucket", "p")
    assert parse_root(spec) is spec


@pytest.mark.parametrize(
    "text, bucket, prefix",
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://bucket/deep/prefix/", "bucket", "deep/prefix"),
        ("s3://bucket/a b/100%/x?y#z", "bucket", "a b/100%/x?y#z"),  # S3 keys are literal, as in the AWS CLI
        ("S3://bucket/p", "bucket", "p"),
    ],
)
def test_s3_roots(text: str, bucket: str, prefix: str) -> None:
    assert parse_root(text) == S3Root(bucket, prefix)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("file://fileserver/share/ckpt", "host"),
        ("file://relative/dir", "host"),
        ("file:///a?b", "query"),
        ("file:///a#b", "fragment"),
        ("file:relative", "absolute"),
        ("s3://", "bucket"),
        ("s3:///prefix", "bucket"),
        ("gs://bucket/x", "unsupported"),
        ("http://host/x", "unsupported"),
    ],
)
def test_refused_roots(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_root(text)


def test_posix_url_round_trips(tmp_path: Path) -> None:
    for name in ("a b", "100%", "café", "q?h#"):
        storage = PosixStorage(tmp_path / name, fsync=False)
        assert "%" in storage.url and " " not in storage.url  # stays percent-encoded: a valid URL
        assert parse_root(storage.url) == PosixRoot(storage.root)
        assert open_storage(storage.url).root == storage.root  # type: ignore[attr-defined]


def test_open_storage_decodes_file_urls(tmp_path: Path) -> None:
    url = (tmp_path / "a b").as_uri()
    assert url.endswith("/a%20b")
    storage = open_storage(url, fsync=False)
    storage.put("k", b"v")
    assert (tmp_path / "a b" / "k").read_bytes() == b"v"
    assert not (tmp_path / "a%20b").exists()
    with pytest.raises(ConfigError, match="host"):
        open_storage("file://elsewhere/x")


def test_volume_checks_use_parse_root(tmp_path: Path) -> None:
    (tmp_path / "a b").mkdir()
    assert volume_of((tmp_path / "a b").as_uri()).path == os.path.realpath(tmp_path / "a b")
    assert check_volumes("s3://bucket/prefix") == []
    with pytest.raises(ConfigError):
        volume_of("s3://bucket/prefix")


def test_checkpointer_file_url_lands_in_the_decoded_directory(tmp_path: Path) -> None:
    url = f"{tmp_path.as_uri()}/a%20b"
    with ckptio.Checkpointer(url, start_writer="on_first_save", volume_check="off") as ck:
        assert ck.storage.url == url
        ck.save(1, {"w": torch.arange(4.0)}).wait()
    assert (tmp_path / "a b" / "step-00000001" / "manifest.json").is_file()
    assert not (tmp_path / "a%20b").exists()
    with ckptio.Checkpointer(url, start_writer="on_first_save", volume_check="off") as ck:
        state = {"w": torch.zeros(4)}
        ck.restore(state)
        assert torch.equal(state["w"], torch.arange(4.0))
