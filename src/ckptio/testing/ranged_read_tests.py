"""The conformance tests of ``Storage.readinto`` (ranged reads into the caller's buffers), part of
:class:`~ckptio.testing.conformance.StoreTests`: restore reads every range it needs with it, so every backend and
wrapper must fill exactly the buffers given, stop at the object's end and raise NotFoundError for a missing key.
"""

from __future__ import annotations

import os

import pytest

from ckptio.errors import NotFoundError
from ckptio.storage.base import Storage


class RangedReadTests:
    """Mixed into StoreTests; ``storage`` and ``large_size`` come from the backend's test class."""

    large_size: int = 3 << 20

    def test_readinto_fills_buffers_in_order(self, storage: Storage) -> None:
        payload = os.urandom(self.large_size)
        storage.put("ri", payload)
        # Three destinations of odd sizes, the middle one a slice of a larger buffer: reads land exactly there.
        head, body, tail = bytearray(1001), bytearray(self.large_size + 64), bytearray(4097)
        middle = memoryview(body)[32 : 32 + self.large_size - 1001 - 4097 - 7]
        n = storage.readinto("ri", [memoryview(head), middle, memoryview(tail)], offset=7)
        assert n == self.large_size - 7
        assert bytes(head) + bytes(middle) + bytes(tail) == payload[7:]
        assert bytes(body[:32]) == bytes(32) and bytes(body[32 + middle.nbytes :]) == bytes(64 + 1001 + 4097 + 7 - 32)

    def test_readinto_stops_at_the_end(self, storage: Storage) -> None:
        storage.put("short", bytes(range(100)))
        buf = bytearray(50)
        assert storage.readinto("short", buf, offset=80) == 20
        assert bytes(buf[:20]) == bytes(range(80, 100))
        assert storage.readinto("short", bytearray(10), offset=100) == 0
        assert storage.readinto("short", bytearray(0), offset=3) == 0
        assert storage.readinto("short", [memoryview(bytearray(3)), memoryview(bytearray(2))], offset=10) == 5

    def test_readinto_missing_key_raises_not_found(self, storage: Storage) -> None:
        with pytest.raises(NotFoundError):
            storage.readinto("missing", bytearray(10))
        with pytest.raises(NotFoundError):
            storage.readinto("missing", bytearray(0))

