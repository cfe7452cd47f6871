"""Fixtures of the storage tests: a reused pool of fresh processes (starting Python + torch is slow)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor

import pytest
from conformance import CONCURRENT_PROCESSES, warm_up


@pytest.fixture(scope="session")
def spawn_pool() -> Iterator[Executor]:
    """Fresh processes that receive storages only by pickling, as the writer processes do.

    A forkserver, not plain spawn: the server imports ckptio (and through it torch) once and every worker
    forks from that clean server, so no worker inherits the test process's threads, sockets or boto3 clients,
    and the pool does not pay a torch import per worker (tens of seconds on a 2-core machine).
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ckptio.storage.s3", "conformance"])
    with ProcessPoolExecutor(CONCURRENT_PROCESSES, mp_context=context) as pool:
        futures = [pool.submit(warm_up, 0.3) for _ in range(CONCURRENT_PROCESSES)]
        for future in futures:
            future.result(timeout=300)
        yield pool
