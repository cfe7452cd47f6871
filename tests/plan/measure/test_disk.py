"""The disk beneath a store: both write paths measured and nothing left behind; the store of every rank writing at
once to it."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_disk_probe_writes_both_ways_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Both rates are real writes into the directory, which holds nothing afterwards (a probe's file left behind
    would be read as part of the store). The rates are timings: only their sign is asserted."""
    from ckptio.plan.measure.disk import measure_disk

    (tmp_path / "kept").write_bytes(b"x")
    rates = measure_disk(str(tmp_path), direct_bytes=1 << 20, writeback_bytes=1 << 20)
    assert rates.direct_bytes_per_s > 0 and rates.writeback_bytes_per_s > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_a_store_on_the_local_disk_takes_its_times_from_the_disk_and_shares_the_write_back_threshold() -> None:
    """:func:`ckptio.plan.measure.disk.on_local_disk`: the store of every rank writing at once, the booking of a
    paced store passed through (None for the bare disk), the kernel's threshold divided among the ranks."""
    from ckptio.plan.measure.disk import DiskRates, on_local_disk
    from ckptio.plan.measure.memory import dirty_background_bytes

    disk = DiskRates(direct_bytes_per_s=100.0, writeback_bytes_per_s=400.0)
    store = on_local_disk(disk, job_bytes=800.0, ranks=4, booked_s=3.0)
    assert (store.store_s, store.writeback_store_s, store.paced_store_s, store.direct_io) == (8.0, 2.0, 3.0, True)
    dirty = dirty_background_bytes()
    # Read twice from /proc: MemAvailable moves a little between the reads.
    assert store.dirty_background_bytes == (None if dirty is None else pytest.approx(dirty / 4, rel=0.05))
    assert on_local_disk(disk, job_bytes=800.0, ranks=4).paced_store_s is None
    assert not on_local_disk(disk, job_bytes=800.0, ranks=4, direct_io=False).direct_io
