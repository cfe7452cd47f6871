"""Functions the conformance kit runs in spawned processes (module level, so a spawned worker can import them).

Each receives its storage by pickling, as a writer process does. They must never rely on the parent's state
beyond what they are passed (the AWS_* environment travels explicitly).
"""

from __future__ import annotations

import os
import time

from ckptio.errors import AlreadyExistsError
from ckptio.storage.base import Storage


def warm_up(hold_s: float) -> int:
    """Import what the tests use, and hold the worker a moment so every worker of the pool gets one call."""
    import ckptio.storage
    import ckptio.storage.s3.s3_storage  # noqa: F401

    time.sleep(hold_s)
    return os.getpid()


def aws_env() -> dict[str, str]:
    """The parent's AWS_* variables: pool workers may have been spawned before a fixture set them."""
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


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
