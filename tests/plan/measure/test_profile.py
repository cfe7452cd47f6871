"""A storage profile file that is not one — binary, empty, nested, huge or mistyped numbers, the wrong file — is a
ConfigError naming the file, and a valid one round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.measure.profile import StorageProfile

_GOOD = {"target": "/x", "write_bytes_per_s": 1e9, "per_writer_bytes_per_s": 1e8, "read_bytes_per_s": 1e9,
         "metadata_ops_per_s": 1000.0, "concurrency": [{"writers": 1, "write_bytes_per_s": 1e8}]}


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (bytes(range(256)), "not text"),
        (b"", "not JSON"),
        (b"[" * 100000, "profile"),
        (b"[1]", "JSON object"),
        (json.dumps({**_GOOD, "write_bytes_per_s": 10**400}).encode(), "write_bytes_per_s"),
        (json.dumps({**_GOOD, "write_bytes_per_s": True}).encode(), "write_bytes_per_s"),
        (json.dumps({**_GOOD, "fsync_s": "fast"}).encode(), "fsync_s"),
        (json.dumps({**_GOOD, "serialize_bytes_per_s": -1}).encode(), "serialize_bytes_per_s"),
        (json.dumps({**_GOOD, "concurrency": [{"writers": "4", "write_bytes_per_s": 1}]}).encode(), "writers"),
        (json.dumps({**_GOOD, "metadata": {"create": "x"}}).encode(), "metadata"),
        (json.dumps({**_GOOD, "truncated": "no"}).encode(), "truncated"),
        (json.dumps({k: v for k, v in _GOOD.items() if k != "target"}).encode(), "missing target"),
    ],
)
def test_a_file_that_is_no_profile_is_a_config_error_naming_it(tmp_path: Path, content: bytes, what: str) -> None:
    path = tmp_path / "profile.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=what) as info:
        StorageProfile.load(path)
    assert str(path) in str(info.value)


def test_a_directory_or_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read profile"):
        StorageProfile.load(tmp_path)
    with pytest.raises(ConfigError, match="cannot read profile"):
        StorageProfile.load(tmp_path / "missing.json")


def test_saving_onto_a_directory_is_a_config_error_and_leaves_no_temp_file(tmp_path: Path) -> None:
    profile = StorageProfile.from_json(_GOOD)
    (tmp_path / "out").mkdir()
    with pytest.raises(ConfigError, match="cannot write the profile"):
        profile.save(tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    profile.save(tmp_path / "p.json")
    assert StorageProfile.load(tmp_path / "p.json") == profile
