"""The conformance tests of paced writes (``put``/``put_file`` with a ``pacer``), part of
:class:`~ckptio.testing.conformance.StoreTests`: a paced flush spreads a save over the time until the next one
only if every backend and wrapper asks its pacer for every byte it sends, and still writes them all intact.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ckptio.storage.base import Storage


class CountingPacer:
    """A pacer that lets everything through at once and remembers what it was asked for."""

    def __init__(self) -> None:
        self.taken: list[int] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> None:
        with self._lock:  # the parts of one object may be sent from several threads
            self.taken.append(nbytes)


class PacedWriteTests:
    """Mixed into StoreTests; ``storage`` and ``large_size`` come from the backend's test class."""

    large_size: int = 3 << 20

    def test_a_paced_write_asks_for_every_byte_before_it_is_sent(self, storage: Storage, tmp_path: Any) -> None:
        payload = os.urandom(self.large_size + 3)
        for how in ("put", "put_file"):
            pacer = CountingPacer()
            if how == "put":
                storage.put(f"paced/{how}", [payload[:1000], payload[1000:]], pacer=pacer)
            else:
                path = tmp_path / "paced"
                path.write_bytes(payload)
                storage.put_file(f"paced/{how}", str(path), pacer=pacer)
            assert sum(pacer.taken) == len(payload), (how, pacer.taken)
            assert storage.get(f"paced/{how}") == payload
