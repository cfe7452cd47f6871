"""The conditional-write half of the storage conformance kit: create-only and compare-and-swap, alone and raced.

Mixed into :class:`~ckptio.testing.conformance.StoreTests`. The commit rests on these two writes (the manifest is
created once; ``latest`` and the owner record move by compare-and-swap), so they are raced by threads and by
processes that receive the storage by pickling, as writer processes do. Never imports the engine.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor

import pytest

from ckptio.errors import AlreadyExistsError, PreconditionError
from ckptio.storage.base import IfMatch, Storage
from ckptio.storage.capabilities import COMPARE_AND_SWAP, CONDITIONAL_CREATE
from ckptio.testing.capability_tests import requires_capability
from ckptio.testing.spawned import create_at, parent_env

__all__ = ["CONCURRENT_CREATORS", "CONCURRENT_PROCESSES", "ConditionalWriteTests"]

CONCURRENT_CREATORS = 6
# Each spawned worker imports torch (through ckptio) once; on a 2-core machine four is what the suite affords.
CONCURRENT_PROCESSES = 4


class ConditionalWriteTests:
    """Create-only and compare-and-swap; subclasses provide ``storage`` and may narrow ``capabilities``."""

    large_size: int = 3 << 20

    @requires_capability(CONDITIONAL_CREATE)
    def test_create_only(self, storage: Storage) -> None:
        storage.put("manifest.json", b"first", mode="create")
        with pytest.raises(AlreadyExistsError) as info:
            storage.put("manifest.json", b"second", mode="create")
        assert isinstance(info.value, FileExistsError)
        assert storage.get("manifest.json") == b"first"

    @requires_capability(CONDITIONAL_CREATE)
    def test_create_only_large(self, storage: Storage) -> None:
        payload = os.urandom(self.large_size)
        storage.put("big", payload, mode="create")
        with pytest.raises(AlreadyExistsError):
            storage.put("big", b"small now", mode="create")
        with pytest.raises(AlreadyExistsError):
            storage.put("big", os.urandom(self.large_size), mode="create")
        assert storage.get("big") == payload

    @requires_capability(CONDITIONAL_CREATE)
    def test_concurrent_creators_threads_one_wins(self, storage: Storage) -> None:
        barrier = threading.Barrier(CONCURRENT_CREATORS)

        def create(i: int) -> str:
            barrier.wait()
            try:
                storage.put("race", f"writer-{i}".encode(), mode="create")
            except AlreadyExistsError:
                return "lost"
            return f"writer-{i}"

        with ThreadPoolExecutor(CONCURRENT_CREATORS) as pool:
            outcomes = list(pool.map(create, range(CONCURRENT_CREATORS)))
        winners = [o for o in outcomes if o != "lost"]
        assert len(winners) == 1
        assert storage.get("race") == winners[0].encode()

    @pytest.mark.multiproc
    @requires_capability(CONDITIONAL_CREATE)
    def test_concurrent_creators_processes_one_wins(self, storage: Storage, spawn_pool: Executor) -> None:
        start_at = time.time() + 1.0
        futures = [
            spawn_pool.submit(create_at, storage, "race", f"proc-{i}".encode(), start_at, parent_env())
            for i in range(CONCURRENT_PROCESSES)
        ]
        outcomes = [f.result(timeout=120) for f in futures]
        assert outcomes.count("won") == 1
        assert outcomes.count("lost") == CONCURRENT_PROCESSES - 1
        winner = outcomes.index("won")
        assert storage.get("race") == f"proc-{winner}".encode()

    @requires_capability(COMPARE_AND_SWAP)
    def test_if_match_compare_and_swap(self, storage: Storage) -> None:
        first = storage.put("latest", b"100")
        second = storage.put("latest", b"200", mode=IfMatch(first.etag))
        assert storage.get("latest") == b"200"
        with pytest.raises(PreconditionError):
            storage.put("latest", b"300", mode=IfMatch(first.etag))  # stale etag
        assert storage.get("latest") == b"200"
        storage.put("latest", b"400", mode=IfMatch(second.etag))
        assert storage.get("latest") == b"400"

    @requires_capability(COMPARE_AND_SWAP)
    def test_if_match_on_missing_key_loses(self, storage: Storage) -> None:
        with pytest.raises(PreconditionError):
            storage.put("nothing", b"x", mode=IfMatch("0123456789abcdef"))
        assert not storage.exists("nothing")
