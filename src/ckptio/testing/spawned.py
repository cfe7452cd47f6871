"""Functions the conformance kit runs in spawned processes (module level, so a spawned worker can import them).

Each receives its storage by pickling, as a writer process does. They must never rely on the parent's state
beyond what they are passed (the environment travels explicitly: a backend's credentials and endpoint may have
been set by a fixture after the pool's workers started).
"""

from __future__ import annotations

import importlib
import os
import time

from ckptio.errors import AlreadyExistsError
from ckptio.storage.base import Storage
from ckptio.storage.registry import storage_modules


def warm_up(hold_s: float) -> int:
    """Import every backend's storage, and hold the worker a moment so every worker of the pool gets one call."""
    for module in storage_modules():
        importlib.import_module(module)
    time.sleep(hold_s)
    return os.getpid()


def parent_env() -> dict[str, str]:
    """The parent's environment: pool workers may have been started before a fixture set a backend's
    credentials or endpoint."""
    return dict(os.environ)


def create_at(storage: Storage, key: str, payload: bytes, start_at: float, env: dict[str, str]) -> str:
    """Sleep until ``start_at`` (wall clock shared by every process), then try a create-only put."""
    os.environ.update(env)
    storage.exists(key + ".warm")  # open the client first, so the creators race on the put itself
    time.sleep(max(0.0, start_at - time.time()))
    try:
        storage.put(key, payload, mode="create")
    except AlreadyExistsError:
        return "lost"
    return "won"


def write_and_read(storage: Storage, key: str, payload: bytes, read_key: str, env: dict[str, str]) -> bytes:
    """Use an unpickled storage in a fresh process: write one key, read another."""
    os.environ.update(env)
    storage.put(key, payload)
    return storage.get(read_key)


def put_through(storage: Storage, prefix: str, size: int, count: int) -> int:
    """Write ``count`` objects of ``size`` bytes; returns the bytes written."""
    for i in range(count):
        storage.put(f"{prefix}/{i}", b"\0" * size)
    return size * count
