"""Volume checks on this machine's real mounts: /dev/shm is tmpfs, the work directory is another device."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ckptio.errors import ConfigError, VolumePolicyError
from ckptio.policy.volumes import check_volumes, enforce_volume_policy, read_mounts, volume_of

SHM = "/dev/shm"
needs_shm = pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm on this machine")


@needs_shm
def test_dev_shm_is_tmpfs_and_another_device_than_the_work_dir(tmp_path: Path) -> None:
    shm = volume_of(SHM)
    work = volume_of(tmp_path)
    assert shm.fs_type == "tmpfs"
    assert shm.kind == "ram"
    assert shm.mount is not None and shm.mount.mount_point == SHM
    assert work.device != shm.device
    assert work.free_bytes > 0 and work.total_bytes >= work.free_bytes


def test_a_missing_path_is_judged_by_its_nearest_existing_parent(tmp_path: Path) -> None:
    vol = volume_of(tmp_path / "not" / "yet")
    assert vol.existing == str(tmp_path.resolve())
    assert vol.path == str((tmp_path / "not" / "yet").resolve())
    assert vol.device == os.stat(tmp_path).st_dev


def test_root_under_home_is_found(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    codes = [f.code for f in check_volumes(home / "ckpt", home=str(home))]
    assert codes == ["root-under-home"]
    assert check_volumes(tmp_path / "scratch" / "ckpt", home=str(home)) == []


def test_home_as_filesystem_root_is_not_a_home_directory(tmp_path: Path) -> None:
    assert check_volumes(tmp_path / "ckpt", home="/") == []


def test_root_on_the_data_volume_is_found(tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    findings = check_volumes(tmp_path / "ckpt", [str(data)], home=str(tmp_path / "nohome"))
    assert [f.code for f in findings] == ["root-on-data-volume"]
    assert str(data) in findings[0].message


@needs_shm
def test_a_ram_root_is_split_from_the_data_but_flagged_as_ram(tmp_path: Path) -> None:
    findings = check_volumes(f"{SHM}/ckptio-test-root", [str(tmp_path)], home=str(tmp_path / "nohome"))
    assert [f.code for f in findings] == ["root-on-ram"]


def test_object_store_roots_have_no_volume() -> None:
    assert check_volumes("s3://bucket/prefix", ["/"]) == []
    with pytest.raises(ConfigError):
        volume_of("s3://bucket/prefix")


def test_enforce_warns_or_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with caplog.at_level(logging.WARNING, logger="ckptio.policy.volumes"):
        findings = enforce_volume_policy(home / "ck", mode="warn", home=str(home))
    assert [f.code for f in findings] == ["root-under-home"]
    assert "root-under-home" in caplog.text
    with pytest.raises(VolumePolicyError) as info:
        enforce_volume_policy(home / "ck", mode="error", home=str(home))
    assert info.value.root == str(home / "ck")
    assert enforce_volume_policy(home / "ck", mode="off", home=str(home)) == []
    with pytest.raises(ConfigError):
        enforce_volume_policy(home / "ck", mode="loud")  # type: ignore[arg-type]


def test_mount_table_parsing_unescapes_names(tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /mnt/my\\040data nfs4 rw,vers=4.2 0 0\n"
        "lustre@tcp:/fs /lustre lustre rw 0 0\n"
        "garbage\n"
    )
    mounts = read_mounts(str(table))
    assert [(m.mount_point, m.fs_type) for m in mounts] == [
        ("/", "ext4"),
        ("/mnt/my data", "nfs4"),
        ("/lustre", "lustre"),
    ]
    assert read_mounts(str(tmp_path / "missing")) == []


def test_the_longest_mount_point_wins(tmp_path: Path) -> None:
    from ckptio.policy.volumes import Mount, _mount_for

    mounts = [
        Mount(source="a", mount_point="/", fs_type="ext4"),
        Mount(source="b", mount_point="/lustre", fs_type="lustre"),
        Mount(source="c", mount_point="/lustre2", fs_type="nfs"),
    ]
    assert _mount_for("/lustre/run1", mounts).fs_type == "lustre"  # type: ignore[union-attr]
    assert _mount_for("/lustre2/x", mounts).fs_type == "nfs"  # type: ignore[union-attr]
    assert _mount_for("/lustrex", mounts).fs_type == "ext4"  # type: ignore[union-attr]
