"""Every key a manifest names stays inside its own step; retention deletes only what a step owns; only canonical
step directory names count. Real checkpoints (written by a real writer), tampered on disk."""

from __future__ import annotations

import json
import os

import pytest

from ckptio._cli.main import main as cli
from ckptio.errors import CorruptCheckpointError, StorageError
from ckptio.format import (
    Manifest,
    apply_retention,
    committed_steps,
    delete_step,
    parse_step_dir,
    read_manifest,
    step_dir,
)
from ckptio.storage.posix.posix_storage import PosixStorage
from tests.format.tamper import data_file, load_manifest, save_manifest, step_path


def test_only_canonical_step_directory_names_count():
    assert parse_step_dir("step-00000099") == 99
    assert parse_step_dir("step-123456789") == 123456789 == parse_step_dir(step_dir(123456789))
    for junk in ("step-0000000099", "step-099", "step--0000001", "step-00000099x", "step-00000099/"):
        assert parse_step_dir(junk) is None, junk


def _manifest_with(files: dict, step: int = 1) -> bytes:
    return json.dumps({"format": "ckptio-manifest/1", "step": step, "world_size": 1, "save_id": 1,
                       "total_bytes": 0, "files": files}).encode()


def _rec(name: str, key: str = "") -> dict:
    return {"name": name, "size": 1, "crc32c": "00000000", "key": key}


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"a.distcp": _rec("a.distcp", "step-00000002/a.distcp")}, "outside step 1"),
        ({"a.distcp": _rec("a.distcp", "h-3fa2/step-00000002/a.distcp")}, "outside step 1"),
        ({"a.distcp": _rec("a.distcp", "link/a.distcp")}, "outside step 1"),
        ({"a.distcp": _rec("a.distcp", "/etc/a.distcp")}, "outside step 1"),
        ({"a.distcp": _rec("a.distcp", "step-00000001/../step-00000002/a.distcp")}, "outside step 1"),
        ({"a.distcp": _rec("a.distcp", "x/h-3fa2/step-00000001/a.distcp")}, "outside step 1"),
        ({"a.distcp": _rec("a.distcp", "step-00000001/b.distcp")}, "outside step 1"),
        ({"..": _rec("..")}, "not a plain file name"),
        ({"sub/a.distcp": _rec("sub/a.distcp")}, "not a plain file name"),
        ({"a.distcp": _rec("b.distcp")}, "describes"),
    ],
)
def test_a_manifest_naming_keys_outside_its_step_is_corrupt(files, why):
    with pytest.raises(CorruptCheckpointError, match=why):
        Manifest.from_json(_manifest_with(files), key="step-00000001/manifest.json")


def test_own_keys_are_accepted():
    m = Manifest.from_json(_manifest_with({"a.distcp": _rec("a.distcp", "h-3fa2/step-00000001/a.distcp"),
                                           "b.distcp": _rec("b.distcp")}))
    assert set(m.files) == {"a.distcp", "b.distcp"}


def test_a_manifest_copied_from_another_step_is_corrupt(ckpt_root):
    storage = PosixStorage(ckpt_root, fsync=False)
    body = load_manifest(ckpt_root, 2)
    save_manifest(ckpt_root, 1, body)  # step 1's manifest now describes step 2's files
    with pytest.raises(CorruptCheckpointError, match="says step 2"):
        read_manifest(storage, 1)
    assert cli(["verify", ckpt_root, "--step", "1"]) == 1


def test_retention_never_follows_a_manifest_into_another_step(ckpt_root):
    """Repro: a manifest that lists another step's data file made retention delete the newest step's data."""
    newest = data_file(ckpt_root, 2)
    name = os.path.basename(newest)
    body = load_manifest(ckpt_root, 1)
    body["files"][name] = {"name": name, "size": os.path.getsize(newest), "crc32c": "00000000",
                           "key": f"step-00000002/{name}"}
    save_manifest(ckpt_root, 1, body)
    storage = PosixStorage(ckpt_root, fsync=False)
    assert cli(["verify", ckpt_root, "--step", "1"]) == 1
    assert apply_retention(storage, keep_last=1, newest_committed=2) == [1]
    assert os.path.exists(newest)
    assert committed_steps(storage) == [2]
    assert cli(["verify", ckpt_root]) == 0


def test_retention_never_deletes_through_a_symlinked_directory(ckpt_root, tmp_path):
    """Repro: a manifest key through a symlinked directory inside the root deleted a file outside the root."""
    outside = tmp_path / "outside"
    (outside / "step-00000001").mkdir(parents=True)
    victims = [outside / "victim.distcp", outside / "step-00000001" / "victim.distcp"]
    for v in victims:
        v.write_bytes(b"not yours")
    os.symlink(outside, os.path.join(ckpt_root, "link"))
    os.symlink(outside, os.path.join(ckpt_root, "h-ab"))  # shaped like a hash directory, and a link
    body = load_manifest(ckpt_root, 1)
    body["files"]["victim.distcp"] = {"name": "victim.distcp", "size": 9, "crc32c": "00000000",
                                      "key": "h-ab/step-00000001/victim.distcp"}
    save_manifest(ckpt_root, 1, body)
    storage = PosixStorage(ckpt_root, fsync=False)
    with pytest.raises(StorageError, match="symbolic link"):  # the one key it may not delete is reported
        delete_step(storage, 1)
    body["files"]["victim.distcp"]["key"] = "link/victim.distcp"
    os.makedirs(step_path(ckpt_root, 1), exist_ok=True)
    save_manifest(ckpt_root, 1, body)
    apply_retention(storage, keep_last=1, newest_committed=2)
    assert all(v.read_bytes() == b"not yours" for v in victims)
    assert committed_steps(storage) == [2]


def test_junk_step_names_are_ignored(ckpt_root):
    """Repro: a junk ``step-0000000099/manifest.json`` (an alias of step 99) made restore raise."""
    junk = os.path.join(ckpt_root, "step-0000000099")
    os.makedirs(junk)
    with open(os.path.join(junk, "manifest.json"), "w") as f:
        f.write("{}")
    storage = PosixStorage(ckpt_root, fsync=False)
    assert committed_steps(storage) == [1, 2]
    apply_retention(storage, keep_last=1, newest_committed=2)
    assert os.path.exists(os.path.join(junk, "manifest.json")), "junk is not ours to delete either"
