"""Every wrapper passes the conformance suite over POSIX; plus what wrappers add (faults, shared throttle)."""

from __future__ import annotations

import errno
import struct
import time
from concurrent.futures import Executor
from pathlib import Path

import pytest

from ckptio.errors import StorageError, StorageFullError
from ckptio.storage import PosixStorage, Storage
from ckptio.testing.conformance import WrapperTests, put_through
from ckptio.testing.wrappers import FaultStorage, LatencyStorage, ThrottledStorage


class TestThrottled(WrapperTests):
    def wrap(self, inner: Storage, tmp_path: Path) -> Storage:
        # Fast enough that the suite's few MiB cost milliseconds, slow enough that the booking logic runs.
        return ThrottledStorage(
            inner, write_bytes_per_s=4e9, read_bytes_per_s=4e9, state_path=str(tmp_path / "throttle")
        )


class TestLatency(WrapperTests):
    def wrap(self, inner: Storage, tmp_path: Path) -> Storage:
        return LatencyStorage(inner, seconds=0.0005)


class TestFaultWithoutFault(WrapperTests):
    def wrap(self, inner: Storage, tmp_path: Path) -> Storage:
        return FaultStorage(inner)


def test_wrappers_pass_through_url_and_region(tmp_path: Path) -> None:
    inner = PosixStorage(tmp_path, fsync=False, region="eu-north-1")
    wrapped = FaultStorage(LatencyStorage(inner, seconds=0))
    assert (wrapped.url, wrapped.region) == (inner.url, "eu-north-1")
    assert wrapped.local_directory() is inner


def test_full_storage_raises_and_keeps_earlier_objects(tmp_path: Path) -> None:
    storage = FaultStorage(PosixStorage(tmp_path, fsync=False), capacity_bytes=1000)
    storage.put("step-1/data", b"a" * 600)
    storage.put("step-1/manifest.json", b"m" * 100)
    with pytest.raises(StorageFullError) as info:
        storage.put("step-2/data", b"b" * 600)
    assert info.value.errno is None or info.value.path == "step-2/data"
    assert "step-2/data" in str(info.value)
    big = tmp_path / "big.bin"
    big.write_bytes(b"c" * 400)
    with pytest.raises(StorageFullError):
        storage.put_file("step-2/file", str(big))
    assert storage.get("step-1/data") == b"a" * 600
    assert storage.get("step-1/manifest.json") == b"m" * 100
    assert not storage.exists("step-2/data")
    assert not storage.exists("step-2/file")


def test_io_error_is_a_storage_error_but_not_full(tmp_path: Path) -> None:
    storage = FaultStorage(PosixStorage(tmp_path, fsync=False), errno_code=errno.EIO, fail_keys_with="ranks/")
    storage.put("step-1/data", b"ok")
    with pytest.raises(StorageError) as info:
        storage.put("step-1/ranks/0.json", b"{}")
    assert not isinstance(info.value, StorageFullError)
    assert "EIO" in str(info.value)
    assert storage.get("step-1/data") == b"ok"  # reads never fail
    assert not storage.exists("step-1/ranks/0.json")


@pytest.mark.multiproc
def test_throttle_budget_is_shared_between_processes(tmp_path: Path, spawn_pool: Executor) -> None:
    bandwidth = 200e6
    per_put, puts_per_process, processes = 1 << 20, 4, 2
    state = tmp_path / "throttle-state"
    state.write_bytes(b"")
    storage = ThrottledStorage(
        PosixStorage(tmp_path / "root", fsync=False), write_bytes_per_s=bandwidth, state_path=str(state)
    )
    before = time.monotonic()  # CLOCK_MONOTONIC is one clock for every process of the host
    futures = [
        spawn_pool.submit(put_through, storage, f"p{p}", per_put, puts_per_process) for p in range(processes)
    ]
    assert sum(f.result(timeout=120) for f in futures) == per_put * puts_per_process * processes
    (booked_until,) = struct.unpack("d", state.read_bytes()[:8])
    # Every byte of both processes was booked on the one clock: the bookings end no earlier than all bytes at
    # the shared bandwidth. Separate budgets would book only one process's share on each clock.
    total = per_put * puts_per_process * processes
    assert booked_until - before >= total / bandwidth
