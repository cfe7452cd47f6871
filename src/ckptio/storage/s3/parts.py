"""How S3 uploads cut bytes into parts: part sizing within S3's limits, and zero-copy file-like views that feed
boto3 a part made of several buffers (or a slice of a file) without joining them into one ``bytes``, each able
to give the CRC32C of its bytes for the request's ``x-amz-checksum-crc32c`` header.

The checksum is computed here, once per part and before the first attempt, rather than by botocore on the
sending thread: the ``crc32c`` package runs in hardware and outside the GIL (botocore's default CRC32 runs in
zlib, and its CRC32C needs awscrt), and a retry then re-sends exactly the bytes that were checksummed.
"""

from __future__ import annotations

import base64
import bisect
import io
import os
from collections.abc import Sequence
from typing import Any

import crc32c

from ckptio.errors import StorageError

MiB = 1 << 20
MIN_PART = 5 * MiB
MAX_PART = 5 << 30
MAX_PARTS = 10_000
CHECKSUM_ALGORITHM = "CRC32C"
_CRC_BLOCK = 1 * MiB


def choose_part_size(total: int, configured: int | None = None) -> int:
    """Part size for an object of ``total`` bytes: ≤ 10,000 parts, ≥ 5 MiB, ≥ 64 MiB for multi-GB objects."""
    wanted = configured or (16 * MiB if total < (2 << 30) else 64 * MiB)
    floor = -(-total // MAX_PARTS)
    floor = -(-floor // MiB) * MiB  # whole MiB keeps part boundaries page-aligned
    return min(max(wanted, floor, MIN_PART), MAX_PART)


class _SizedReader(io.RawIOBase):
    """A readable, seekable stream of a known size; subclasses say where the bytes come from."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size, self._pos = size, 0

    def __len__(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def crc32c(self) -> int:
        """CRC32C of all the bytes, whatever the position (reads nothing through ``read``)."""
        raise NotImplementedError

    def checksum_args(self) -> dict[str, str]:
        """PutObject/UploadPart arguments that send the body's CRC32C for S3 to verify before it stores it."""
        return {"ChecksumAlgorithm": CHECKSUM_ALGORITHM, "ChecksumCRC32C": encode_crc32c(self.crc32c())}


class SegmentReader(_SizedReader):
    """A seekable file over byte views, so a part goes out without joining its buffers into one ``bytes``."""

    def __init__(self, segments: Sequence[memoryview]) -> None:
        self._segments = [s for s in segments if s.nbytes]
        self._starts: list[int] = []
        total = 0
        for seg in self._segments:
            self._starts.append(total)
            total += seg.nbytes
        super().__init__(total)

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        done = 0
        while done < out.nbytes and self._pos < self._size:
            index = bisect.bisect_right(self._starts, self._pos) - 1
            seg, inner = self._segments[index], self._pos - self._starts[index]
            n = min(seg.nbytes - inner, out.nbytes - done)
            out[done : done + n] = seg[inner : inner + n]
            done += n
            self._pos += n
        return done

    def read(self, size: int | None = -1) -> bytes:
        # One contiguous slice is returned without an intermediate buffer; the http layer asks for blocks.
        remaining = self._size - self._pos
        size = remaining if size is None or size < 0 else min(size, remaining)
        if size <= 0:
            return b""
        index = bisect.bisect_right(self._starts, self._pos) - 1
        seg, inner = self._segments[index], self._pos - self._starts[index]
        if inner + size <= seg.nbytes:
            self._pos += size
            return seg[inner : inner + size].tobytes()
        out = bytearray(size)
        self.readinto(out)
        return bytes(out)

    def crc32c(self) -> int:
        value = 0
        for seg in self._segments:
            value = crc32c.crc32c(seg, value)
        return value


class FileSlice(_SizedReader):
    """``length`` bytes of an open file from ``offset``, read with ``pread`` so parts share one descriptor."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self._fd, self._offset = fd, offset
        super().__init__(length)

    def read(self, size: int | None = -1) -> bytes:
        remaining = self._size - self._pos
        size = remaining if size is None or size < 0 else min(size, remaining)
        if size <= 0:
            return b""
        out = os.pread(self._fd, size, self._offset + self._pos)
        self._pos += len(out)
        return out

    def readinto(self, buffer: Any) -> int:
        out = self.read(memoryview(buffer).nbytes)
        memoryview(buffer).cast("B")[: len(out)] = out
        return len(out)

    def crc32c(self) -> int:
        # Into one reused block: no allocation per read. The send that follows finds these pages cached.
        block, value, done = bytearray(min(self._size, _CRC_BLOCK)), 0, 0
        view = memoryview(block)
        while done < self._size:
            n = os.preadv(self._fd, [view[: min(len(block), self._size - done)]], self._offset + done)
            if n == 0:
                raise StorageError(f"file ended {self._size - done} bytes short of the part being sent")
            value = crc32c.crc32c(view[:n], value)
            done += n
        return value


def encode_crc32c(value: int) -> str:
    """A CRC32C as S3 writes it in ``x-amz-checksum-crc32c``: the 4 big-endian bytes in base64."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def split_parts(buffers: Sequence[memoryview], part_size: int) -> list[list[memoryview]]:
    """Cut a list of views into parts of ``part_size`` bytes (the last may be shorter), without copying."""
    parts: list[list[memoryview]] = []
    current: list[memoryview] = []
    room = part_size
    for buf in buffers:
        pos = 0
        while pos < buf.nbytes:
            take = min(room, buf.nbytes - pos)
            current.append(buf[pos : pos + take])
            pos += take
            room -= take
            if room == 0:
                parts.append(current)
                current, room = [], part_size
    if current:
        parts.append(current)
    return parts
