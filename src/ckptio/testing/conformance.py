"""The storage conformance suite: every guarantee of ``ckptio.storage.base`` as tests, for every backend.

A backend's test module subclasses :class:`StoreTests` and provides a ``storage`` fixture yielding an empty
key space (zarr-python's ``StoreTests`` habit); a wrapper's subclasses :class:`WrapperTests` and defines
``wrap``, which adds the check that every capability of the inner storage shows through the wrapper. The
module is also a pytest plugin: load it with ``pytest_plugins = ["ckptio.testing.conformance"]`` in a
``conftest.py`` to get the ``spawn_pool`` fixture the cross-process tests use (and the ``requires_capability``
marker). The suite never looks behind the protocol: what it checks is what commit, retention, restore and probe
rely on.

Not every store honours every guarantee (s3rver ignores conditional writes). A backend declares what it honours
in the class attribute ``capabilities`` (names from :mod:`ckptio.storage.capabilities`); a test that needs a
capability is marked ``@requires_capability(name)`` and skips, with the reason, for a backend that declares it
lacks it; and ``test_capabilities_are_detected_as_declared`` asserts the capability probe finds exactly what
the backend declares, so a declaration can neither hide a missing guarantee nor invent one.
"""

from __future__ import annotations

import os
import pickle
import threading
from array import array
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckptio.errors import AlreadyExistsError, ConfigError, NotFoundError
from ckptio.storage.base import (
    Data,
    Exposure,
    LocalDirectory,
    ObjectInfo,
    Pacer,
    PutMode,
    Storage,
    WriteConditions,
    hashed_key,
)
from ckptio.storage.capabilities import CONDITIONAL_CREATE
from ckptio.storage.posix.posix_storage import PosixStorage
from ckptio.testing.capability_tests import CapabilityTests, pytest_configure, requires_capability
from ckptio.testing.conditional_write_tests import CONCURRENT_PROCESSES, ConditionalWriteTests
from ckptio.testing.fork_server import fork_context
from ckptio.testing.listing_tests import ListingTests
from ckptio.testing.paced_write_tests import PacedWriteTests
from ckptio.testing.ranged_read_tests import RangedReadTests
from ckptio.testing.spawned import parent_env, put_through, warm_up, write_and_read

__all__ = ["StoreTests", "WrapperTests", "put_through", "pytest_configure", "requires_capability", "spawn_pool"]


class StoreTests(CapabilityTests, ListingTests, ConditionalWriteTests, RangedReadTests, PacedWriteTests):
    """Subclass and define a ``storage`` fixture returning an empty storage (function scope)."""

    # Sizes large enough to take a backend's multi-part path when the subclass configures a small threshold.
    large_size: int = 3 << 20

    # ---- put / get -----------------------------------------------------------------------------------------
    def test_round_trip_single_buffer(self, storage: Storage) -> None:
        info = storage.put("a/b.bin", b"hello world")
        assert storage.get("a/b.bin") == b"hello world"
        assert info.key == "a/b.bin"
        assert info.size == 11

    def test_round_trip_list_of_mixed_buffers(self, storage: Storage) -> None:
        floats = array("f", [1.5, -2.0, 3.25])  # itemsize 4: must be cast to bytes, not truncated
        parts: list[bytes | bytearray | memoryview] = [b"ab", bytearray(b"cd"), memoryview(b"xxefxx")[2:4],
                                                       memoryview(floats), b""]
        storage.put("mixed", parts)
        assert storage.get("mixed") == b"abcdef" + floats.tobytes()
        assert storage.head("mixed").size == 6 + floats.itemsize * 3

    def test_numpy_buffer(self, storage: Storage) -> None:
        np = pytest.importorskip("numpy")
        arr = np.arange(1000, dtype=np.float64).reshape(10, 100)
        storage.put("np", memoryview(arr))
        assert storage.get("np") == arr.tobytes()

    def test_empty_object(self, storage: Storage) -> None:
        info = storage.put("empty", b"")
        assert info.size == 0
        assert storage.get("empty") == b""
        assert storage.head("empty").size == 0
        storage.put("empty-list", [])
        assert storage.get("empty-list") == b""

    def test_large_object_across_buffers(self, storage: Storage) -> None:
        payload = os.urandom(self.large_size)
        cut1, cut2 = 12345, self.large_size // 2 + 7
        views = [memoryview(payload)[:cut1], memoryview(payload)[cut1:cut2], memoryview(payload)[cut2:]]
        info = storage.put("large", views)
        assert info.size == self.large_size
        assert storage.get("large") == payload
        assert storage.get("large", offset=cut2 - 10, length=20) == payload[cut2 - 10 : cut2 + 10]

    def test_overwrite_replaces_content_and_etag(self, storage: Storage) -> None:
        first = storage.put("k", b"one")
        second = storage.put("k", b"two!")
        assert storage.get("k") == b"two!"
        assert storage.head("k") == second
        assert first.etag != second.etag

    def test_reader_never_sees_a_partial_object(self, storage: Storage) -> None:
        versions = [b"A" * 300_000, b"B" * 200_000]
        storage.put("flip", versions[0])
        stop = threading.Event()

        def writer() -> None:
            for i in range(10):
                storage.put("flip", versions[i % 2])
            stop.set()

        thread = threading.Thread(target=writer)
        thread.start()
        seen = set()
        while not stop.is_set():
            seen.add(storage.get("flip"))
        thread.join()
        assert seen <= set(versions)

    # ---- ranged get / head ---------------------------------------------------------------------------------
    def test_ranged_get(self, storage: Storage) -> None:
        storage.put("r", bytes(range(100)))
        assert storage.get("r", offset=10, length=5) == bytes(range(10, 15))
        assert storage.get("r", offset=90) == bytes(range(90, 100))
        assert storage.get("r", length=3) == b"\x00\x01\x02"
        assert storage.get("r", offset=95, length=50) == bytes(range(95, 100))
        assert storage.get("r", offset=100) == b""
        assert storage.get("r", offset=5, length=0) == b""

    def test_head_size_and_etag(self, storage: Storage) -> None:
        info = storage.put("h", b"x" * 1234)
        head = storage.head("h")
        assert isinstance(head, ObjectInfo)
        assert (head.key, head.size, head.etag) == ("h", 1234, info.etag)
        assert head.etag

    def test_missing_keys_raise_not_found(self, storage: Storage) -> None:
        with pytest.raises(NotFoundError):
            storage.get("missing")
        with pytest.raises(NotFoundError):
            storage.get("missing", offset=3, length=2)
        with pytest.raises(NotFoundError):
            storage.head("missing")
        with pytest.raises(FileNotFoundError):  # NotFoundError is also the builtin
            storage.head("dir/missing")
        assert not storage.exists("missing")
        storage.put("present", b"1")
        assert storage.exists("present")

    def test_not_found_carries_context(self, storage: Storage) -> None:
        with pytest.raises(NotFoundError) as info:
            storage.get("nowhere/x")
        assert info.value.root == storage.url
        assert "nowhere/x" in str(info.value)

    def test_unknown_put_mode_is_refused_before_writing(self, storage: Storage) -> None:
        with pytest.raises(ConfigError):
            storage.put("k", b"x", mode="append")  # type: ignore[arg-type]
        assert not storage.exists("k")

    # ---- derived operations --------------------------------------------------------------------------------
    def test_put_file(self, storage: Storage, tmp_path: Any) -> None:
        for name, size in (("small", 1000), ("large", self.large_size + 3)):
            path = tmp_path / name
            payload = os.urandom(size)
            path.write_bytes(payload)
            info = storage.put_file(f"files/{name}", str(path))
            assert info.size == size
            assert storage.get(f"files/{name}") == payload

    @requires_capability(CONDITIONAL_CREATE)
    def test_put_file_create_only(self, storage: Storage, tmp_path: Any) -> None:
        path = tmp_path / "f"
        path.write_bytes(b"content")
        storage.put_file("f", str(path), mode="create")
        with pytest.raises(AlreadyExistsError):
            storage.put_file("f", str(path), mode="create")

    def test_get_many(self, storage: Storage) -> None:
        expected = {f"many/{i}": os.urandom(100 + i) for i in range(12)}
        for key, value in expected.items():
            storage.put(key, value)
        assert storage.get_many(list(expected)) == expected
        assert storage.get_many([]) == {}
        with pytest.raises(NotFoundError):
            storage.get_many(["many/0", "many/missing"])

    # ---- pickling ------------------------------------------------------------------------------------------
    def test_pickle_round_trip_in_process(self, storage: Storage) -> None:
        storage.put("before", b"1")
        clone = pickle.loads(pickle.dumps(storage))
        assert clone.url == storage.url
        assert clone.get("before") == b"1"
        clone.put("after", b"2")
        assert storage.get("after") == b"2"

    @pytest.mark.multiproc
    def test_works_in_spawned_process(self, storage: Storage, spawn_pool: Executor) -> None:
        storage.put("from-parent", b"parent")
        future = spawn_pool.submit(write_and_read, storage, "from-child", b"child", "from-parent", parent_env())
        got = future.result(120)
        assert got == b"parent"
        assert storage.get("from-child") == b"child"

    def test_close_is_idempotent(self, storage: Storage) -> None:
        storage.put("x", b"1")
        storage.close()
        storage.close()

    # ---- capabilities --------------------------------------------------------------------------------------
    def test_capabilities_are_declared(self, storage: Storage) -> None:
        assert isinstance(storage.url, str) and storage.url
        assert isinstance(storage.store_id, str) and storage.store_id
        assert isinstance(storage.hash_prefix, bool) and isinstance(storage.writes_in_parts, bool)
        assert storage.write_conditions.create and storage.write_conditions.swap
        clone = pickle.loads(pickle.dumps(storage))
        assert _capabilities(clone) == _capabilities(storage)

    def test_data_key_is_where_data_goes(self, storage: Storage) -> None:
        key = "step-00000100/__0_0.distcp"
        data_key = storage.data_key(key)
        assert data_key == (hashed_key(key) if storage.hash_prefix else key)
        storage.put(data_key, b"data")
        assert storage.get(data_key) == b"data"
        directory = storage.local_directory()
        if directory is not None:
            with open(directory.local_path(data_key), "rb") as f:
                assert f.read() == b"data"

    def test_copy_to_another_storage(self, storage: Storage, tmp_path: Path) -> None:
        payload = os.urandom(self.large_size + 5)
        storage.put("step-00000001/__0_0.distcp", payload)
        target = PosixStorage(tmp_path / "copy-target", fsync=False)
        info = storage.copy_to("step-00000001/__0_0.distcp", target, "up/x", pacer=None)
        assert (info.key, info.size) == ("up/x", len(payload))
        assert target.get("up/x") == payload
        with pytest.raises(NotFoundError):
            storage.copy_to("step-00000001/missing", target, "up/y")
        assert not target.exists("up/y")


def _capabilities(storage: Storage) -> tuple[object, ...]:
    directory = storage.local_directory()
    return (storage.url, storage.store_id, storage.hash_prefix, storage.writes_in_parts, storage.write_conditions,
            None if directory is None else directory.root)


class _PlacedDirectory:
    root = "/placed"

    def local_path(self, key: str) -> str:
        return f"/placed/{key}"


class _Placed(Storage):
    """Declares distinctive capabilities and nothing else: what a wrapper must show of the storage it wraps."""

    @property
    def url(self) -> str:
        return "memory://placed/root"

    @property
    def store_id(self) -> str:
        return "memory://placed/root at the placed endpoint"

    @property
    def write_conditions(self) -> WriteConditions:
        return WriteConditions(create="placed-create", swap="placed-swap")

    @property
    def writes_in_parts(self) -> bool:
        return True

    def local_directory(self) -> LocalDirectory | None:
        return _PlacedDirectory()

    @property
    def hash_prefix(self) -> bool:
        return True

    @property
    def region(self) -> str | None:
        return "xx-placed-1"

    def public_exposure(self) -> Exposure:
        return Exposure(public=True, detail="placed: public by construction")

    def data_key(self, key: str) -> str:
        return f"placed/{key}"

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        raise NotImplementedError

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        raise NotImplementedError

    def head(self, key: str) -> ObjectInfo:
        raise NotImplementedError

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError


class WrapperTests(StoreTests):
    """For a storage wrapper: the whole suite through it, and every capability of its inner storage shown through.

    Subclass and define ``wrap(inner, tmp_path)`` returning the wrapper around ``inner``. The ``storage`` fixture
    wraps an empty POSIX directory; override it to wrap another backend.
    """

    def wrap(self, inner: Storage, tmp_path: Path) -> Storage:
        raise NotImplementedError("a WrapperTests subclass defines wrap(inner, tmp_path)")

    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return self.wrap(PosixStorage(tmp_path / "root", fsync=False), tmp_path)

    def test_wrapper_reports_its_inner_capabilities(self, tmp_path: Path) -> None:
        inner = _Placed()
        for wrapped in (self.wrap(inner, tmp_path), self.wrap(self.wrap(inner, tmp_path), tmp_path)):
            assert (wrapped.url, wrapped.store_id, wrapped.hash_prefix, wrapped.region, wrapped.writes_in_parts) == (
                "memory://placed/root", inner.store_id, True, "xx-placed-1", True
            )
            assert wrapped.write_conditions == inner.write_conditions
            assert wrapped.public_exposure() == inner.public_exposure()
            assert wrapped.data_key("step-00000001/x") == "placed/step-00000001/x"
            directory = wrapped.local_directory()
            assert directory is not None and directory.local_path("a/b") == "/placed/a/b"


# ---- plugin fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def spawn_pool() -> Iterator[Executor]:
    """Fresh processes that receive storages only by pickling, as the writer processes do.

    A forkserver, not plain spawn: the server imports ckptio (and through it torch) once and every worker
    forks from that clean server, so no worker inherits the test process's threads, sockets or boto3 clients,
    and the pool does not pay a torch import per worker (tens of seconds on a 2-core machine).
    """
    with ProcessPoolExecutor(CONCURRENT_PROCESSES, mp_context=fork_context()) as pool:
        futures = [pool.submit(warm_up, 0.3) for _ in range(CONCURRENT_PROCESSES)]
        for future in futures:
            future.result(timeout=300)
        yield pool
