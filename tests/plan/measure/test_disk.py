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


def test_the_page_cache_is_dropped_whole_where_allowed_else_file_by_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from ckptio.plan.measure import disk

    (tmp_path / "store" / "step-1").mkdir(parents=True)
    for name in ("store/step-1/a.distcp", "store/step-1/.metadata", "alone.bin"):
        (tmp_path / name).write_bytes(b"x" * 4096)
    paths = [str(tmp_path / "store"), str(tmp_path / "alone.bin"), str(tmp_path / "gone")]
    knob = tmp_path / "drop_caches"
    knob.write_text("")
    monkeypatch.setattr(disk, "DROP_CACHES", str(knob))
    assert disk.drop_page_cache(paths) == "drop_caches" and knob.read_text() == "1"
    # Without the right to write the knob (a directory stands in for it): every file's pages, one by one.
    monkeypatch.setattr(disk, "DROP_CACHES", str(tmp_path / "store"))
    advised: list[str] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_DONTNEED and (offset, length) == (0, 0)
        advised.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    assert disk.drop_page_cache(paths) == "fadvise"
    assert sorted(advised) == sorted(str(tmp_path / n) for n in ("store/step-1/a.distcp", "store/step-1/.metadata",
                                                                  "alone.bin"))
    monkeypatch.delattr(os, "posix_fadvise")
    assert disk.drop_page_cache(paths) == "none"
