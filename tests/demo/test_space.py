"""The demo checks its store directory's free space before it writes a checkpoint: a disk that fills halfway
through a run would end it after minutes of work."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckptio.demo.space import TRIAL_SAVES, check_store_space, store_bytes_needed
from ckptio.errors import ConfigError, StorageFullError

GIB = 2**30


def test_the_store_peaks_at_every_save_of_every_directory_run() -> None:
    need = store_bytes_needed(state_bytes=GIB, saves_per_run=5, directory_runs=4, calibrate=True)
    assert 20 * GIB < need < 21.5 * GIB  # 20 checkpoints and their metadata
    # The S3 store takes ckptio's run elsewhere: three runs write the directory.
    assert store_bytes_needed(state_bytes=GIB, saves_per_run=5, directory_runs=3, calibrate=False) < need


def test_the_calibrate_trial_sets_the_peak_when_the_runs_save_less() -> None:
    trial_only = store_bytes_needed(state_bytes=GIB, saves_per_run=2, directory_runs=1, calibrate=True)
    assert trial_only >= TRIAL_SAVES * GIB
    assert store_bytes_needed(state_bytes=GIB, saves_per_run=2, directory_runs=1, calibrate=False) < trial_only


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ConfigError):
        store_bytes_needed(state_bytes=GIB, saves_per_run=-1, directory_runs=4, calibrate=True)


def test_more_than_the_disk_has_free_is_refused_with_both_figures(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(StorageFullError, match=r"needs .* free under .* and .* are") as caught:
        check_store_space(str(tmp_path), free + 1024 * GIB, what="4 runs x 5 saves")
    assert caught.value.path == str(tmp_path)
    assert "4 runs x 5 saves" in str(caught.value)
    check_store_space(str(tmp_path), 1, what="one byte")  # room enough: nothing raised
