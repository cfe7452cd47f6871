"""O_DIRECT writes (``ckptio.storage.posix.direct_io``): exact bytes at every size around the alignment and chunk edges,
through ``PosixStorage.put`` and ``put_file``, and a clean fallback to buffered writes where a filesystem refuses."""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import random
from pathlib import Path

import pytest

from ckptio.storage import PosixStorage
from ckptio.storage.posix import direct_io
from ckptio.storage.posix.direct_io import ALIGN, CHUNK, DirectIOUnsupported, write_direct
from ckptio.storage.posix.posix_storage import TMP_PREFIX

pytestmark = pytest.mark.skipif(not direct_io.available(), reason="no O_DIRECT on this platform")

SIZES = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 12345]


def _parts(data: bytes, rng: random.Random) -> list[memoryview]:
    """``data`` cut at random points, as the writer hands over framing headers and tensor bytes."""
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 6))) if data else []
    bounds = [0, *cuts, len(data)]
    return [memoryview(data)[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("size", SIZES)
def test_write_direct_writes_exactly_the_bytes(tmp_path: Path, size: int) -> None:
    rng = random.Random(size)
    data = rng.randbytes(size)
    path = str(tmp_path / "f")
    assert write_direct(path, _parts(data, rng)) == size
    assert os.path.getsize(path) == size
    assert Path(path).read_bytes() == data


def test_write_direct_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"committed")
    with pytest.raises(FileExistsError):
        write_direct(str(path), [memoryview(b"x" * 10)])
    assert path.read_bytes() == b"committed"


def test_put_and_put_file_round_trip_through_o_direct(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path / "root", direct_io=True)
    data = random.Random(0).randbytes(CHUNK + 777)
    storage.put("step/a", [memoryview(data)[:100], memoryview(data)[100:]])
    src = tmp_path / "src"
    src.write_bytes(data)
    storage.put_file("step/b", str(src))
    assert storage.get("step/a") == data and storage.get("step/b") == data
    assert not storage._direct_refused
    assert [n for n in os.listdir(tmp_path / "root" / "step") if n.startswith(TMP_PREFIX)] == []


def test_the_default_uses_o_direct_only_for_large_objects_on_an_fsynced_tier(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = direct_io.write_direct

    def counting(path: str, parts, *, fsync: bool = True, pacer=None) -> int:  # type: ignore[no-untyped-def]
        size = real(path, parts, fsync=fsync, pacer=pacer)
        calls.append(size)
        return size

    monkeypatch.setattr("ckptio.storage.posix.posix_storage.write_direct", counting)
    big, small = b"b" * direct_io.MIN_BYTES, b"s" * 1000
    PosixStorage(tmp_path / "durable").put("big", big)
    PosixStorage(tmp_path / "durable").put("small", small)
    PosixStorage(tmp_path / "ram", fsync=False).put("big", big)
    PosixStorage(tmp_path / "off", direct_io=False).put("big", big)
    assert calls == [len(big)]
    assert (tmp_path / "ram" / "big").read_bytes() == big


@pytest.mark.parametrize("where", ["open", "write"])
def test_a_filesystem_refusing_o_direct_falls_back_to_buffered_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     where: str) -> None:
    # Mocked: every filesystem this machine can mount accepts O_DIRECT (tmpfs too, since Linux 6.6), so the EINVAL
    # that FUSE and some NFS mounts return is injected into os.open/os.write for O_DIRECT descriptors only.
    real_open, real_write = os.open, os.write

    def refusing_open(path, flags, *args):  # type: ignore[no-untyped-def]
        if where == "open" and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def refusing_write(fd, data):  # type: ignore[no-untyped-def]
        if where == "write" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(direct_io.os, "open", refusing_open)
    monkeypatch.setattr(direct_io.os, "write", refusing_write)
    storage = PosixStorage(tmp_path / "root", direct_io=True)
    data = random.Random(1).randbytes(3 * ALIGN + 5)
    with pytest.raises(DirectIOUnsupported):
        write_direct(str(tmp_path / "probe"), [memoryview(data)])
    assert not (tmp_path / "probe").exists()
    storage.put("a", data)
    assert storage._direct_refused
    assert storage.get("a") == data
    assert [n for n in os.listdir(tmp_path / "root") if n.startswith(TMP_PREFIX)] == []


def test_read_direct_fills_unaligned_buffers_across_bounce_chunks(tmp_path: Path) -> None:
    data = random.Random(2).randbytes(2 * CHUNK + 3 * ALIGN + 17)
    (tmp_path / "f").write_bytes(data)
    for offset, sizes in ((0, [len(data)]), (4095, [1, CHUNK, CHUNK + 5]), (CHUNK - 3, [7, 11, 2 * ALIGN]),
                          (len(data) - 100, [60, 60])):  # the last one runs past the end: a short read
        bufs = [bytearray(n + 1) for n in sizes]  # one spare byte each: must stay untouched
        views = [memoryview(b)[:n] for b, n in zip(bufs, sizes, strict=True)]
        got = direct_io.read_direct(str(tmp_path / "f"), offset, views)
        assert got == min(sum(sizes), len(data) - offset)
        assert b"".join(bytes(v) for v in views)[:got] == data[offset : offset + got]
        assert all(b[-1] == 0 for b in bufs)


def test_ranged_reads_use_o_direct_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = direct_io.read_direct

    def counting(path: str, offset: int, views):  # type: ignore[no-untyped-def]
        calls.append(offset)
        return real(path, offset, views)

    monkeypatch.setattr("ckptio.storage.posix.posix_storage.read_direct", counting)
    data = random.Random(3).randbytes(3 << 20)
    for storage in (PosixStorage(tmp_path / "direct", direct_io=True), PosixStorage(tmp_path / "durable"),
                    PosixStorage(tmp_path / "ram", fsync=False)):
        storage.put("k", data)
        out = bytearray(2 << 20)
        assert storage.readinto("k", out, offset=12345) == len(out)
        assert bytes(out) == data[12345 : 12345 + len(out)]
        assert storage.readinto("k", bytearray(100), offset=5) == 100  # small: through the page cache
    assert calls == [12345]


def test_reads_fall_back_to_buffered_where_o_direct_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refusing_open(path, flags, *args):  # type: ignore[no-untyped-def]
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    data = random.Random(4).randbytes(2 << 20)
    storage = PosixStorage(tmp_path / "root", direct_io=False)
    storage.put("a", data)
    storage.direct_io = True
    monkeypatch.setattr(direct_io.os, "open", refusing_open)
    out = bytearray(len(data))
    assert storage.readinto("a", out) == len(data) and bytes(out) == data
    assert storage._direct_refused
