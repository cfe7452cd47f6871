"""Whether the demo's store directory can hold what the demo writes, checked before it writes a checkpoint.

The demo keeps every save of every run until all of them are measured (files deleted a moment ago would hand their
page-cache pages, cheap to take again on a VM, to the next run's saves), so its store peaks at the sum of the runs'
checkpoints: ~7.5 GiB for the default job. A disk that fills halfway through a run ends that run with a storage
error after minutes of work; this says so before the first one, with what is needed and what is free. It must
never write or delete anything.
"""

from __future__ import annotations

import shutil

from ckptio.errors import ConfigError, StorageFullError
from ckptio.plan.units import format_bytes

TRIAL_SAVES = 9
"""Saves of the calibrate launch's trial (a warm-up and :func:`ckptio.plan.measure.training.measure_save_loss`'s eight
repeats), kept until it ends, then removed: they never sit beside the runs' checkpoints."""

_MARGIN = 1.05
"""Room for what a save writes besides its tensors (DCP's ``.metadata``, ckptio's manifest and rank indexes)."""


def store_bytes_needed(*, state_bytes: int, saves_per_run: int, directory_runs: int, calibrate: bool) -> int:
    """The most the store directory holds at once: every save of the ``directory_runs`` runs that write it
    (the S3 store's run writes elsewhere), or the calibrate trial's saves if those are more."""
    if state_bytes < 0 or saves_per_run < 0 or directory_runs < 0:
        raise ConfigError("bytes, saves and runs must be >= 0")
    saves = max(directory_runs * saves_per_run, TRIAL_SAVES if calibrate else 0)
    return int(saves * state_bytes * _MARGIN)


def check_store_space(directory: str, needed: int, *, what: str) -> None:
    """Raise :class:`~ckptio.errors.StorageFullError` if the filesystem of ``directory`` has less than ``needed``
    bytes free; ``what`` says what needs them."""
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise StorageFullError(
            f"the demo needs {format_bytes(needed)} free under {directory} ({what}) and {format_bytes(free)} "
            "are: free some space, give --out on a larger volume, or save less (--saves, --quick)",
            path=directory,
        )
