"""The scheme registry: a new backend is one package and one registry line, and every caller finds it.

``MemStorage`` below is a toy backend (a dict per bucket name, this process only) registered for ``mem://`` by one
added :class:`~ckptio.storage.registry.Backend` line, as docs/architecture.md ("A new backend") says a GCS or
Azure backend would be. Nothing else is changed, and yet parsing, opening, the capability probe, residency, the
admission gate and the probe's capability check all reach it: none of them names a backend.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptio.errors import AlreadyExistsError, ConfigError, NotFoundError, PreconditionError
from ckptio.plan.admit import admit
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import shape_checkpoint
from ckptio.plan.job.presets import PRESETS
from ckptio.plan.measure.probe import target_capabilities
from ckptio.policy.residency import Residency
from ckptio.storage import PosixRoot, Root, Storage, open_storage, parse_root, registry
from ckptio.storage.base import (
    Data,
    Exposure,
    IfMatch,
    ObjectInfo,
    Pacer,
    PutMode,
    WriteConditions,
    as_buffers,
    check_put_mode,
    join_key,
)
from ckptio.storage.capabilities import ALL_CAPABILITIES, detect_capabilities
from ckptio.storage.registry import Backend

_BUCKETS: dict[str, dict[str, bytes]] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class MemRoot(Root):
    bucket: str

    @property
    def url(self) -> str:
        return f"mem://{self.bucket}"


def parse_mem_url(url: str) -> MemRoot:
    bucket = url.split("://", 1)[1].strip("/")
    if not bucket:
        raise ConfigError(f"{url!r} names no bucket")
    return MemRoot(bucket)


class MemStorage(Storage):
    """A dict as a key space: conditional writes under one lock, a public bucket when its name says so."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.objects = _BUCKETS.setdefault(bucket, {})

    @classmethod
    def open_root(cls, root: Root, **options: Any) -> MemStorage:
        assert isinstance(root, MemRoot) and not options
        return cls(root.bucket)

    @property
    def url(self) -> str:
        return f"mem://{self.bucket}"

    @property
    def write_conditions(self) -> WriteConditions:
        return WriteConditions(create="a dict lookup", swap="a dict compare")

    @property
    def region(self) -> str | None:
        return "mem-1"

    def public_exposure(self) -> Exposure:
        return Exposure(public=self.bucket.startswith("public"), detail=f"bucket {self.bucket} by its name")

    def _info(self, key: str, body: bytes) -> ObjectInfo:
        return ObjectInfo(key=key, size=len(body), etag=f"{hash(body) & 0xFFFFFFFF:x}-{len(body)}")

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        check_put_mode(mode)
        body = b"".join(bytes(b) for b in as_buffers(data))
        with _LOCK:
            current = self.objects.get(key)
            if mode == "create" and current is not None:
                raise AlreadyExistsError(f"{key!r} exists", root=self.url)
            if isinstance(mode, IfMatch) and (current is None or self._info(key, current).etag != mode.etag):
                raise PreconditionError(f"{key!r} changed", root=self.url)
            self.objects[key] = body
        return self._info(key, body)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        body = self.objects.get(key)
        if body is None:
            raise NotFoundError(f"no such object {key!r}", root=self.url)
        return body[offset:] if length is None else body[offset : offset + length]

    def head(self, key: str) -> ObjectInfo:
        return self._info(key, self.get(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for key, body in builtins.list(self.objects.items()):
            if key.startswith(prefix):
                yield self._info(key, body)

    def delete(self, key: str) -> None:
        self.objects.pop(join_key(key), None)


@pytest.fixture
def mem_backend(monkeypatch: pytest.MonkeyPatch) -> Backend:
    backend = Backend(name="mem", schemes=("mem",), root_type=MemRoot, parse=parse_mem_url,
                      storage=f"{__name__}:MemStorage")
    monkeypatch.setattr(registry, "BACKENDS", (*registry.BACKENDS, backend))
    return backend


def test_a_registered_scheme_parses_and_opens(mem_backend: Backend) -> None:
    assert parse_root("MEM://b1/") == MemRoot("b1")
    storage = open_storage("mem://b1")
    assert isinstance(storage, MemStorage) and storage.url == "mem://b1"
    assert registry.backend_of(MemRoot("b1")) is mem_backend
    assert "tests.storage.test_registry" in registry.storage_modules()
    with pytest.raises(ConfigError, match="names no bucket"):
        parse_root("mem://")


def test_an_unregistered_scheme_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unsupported storage URL .*file://, s3://"):
        parse_root("mem://b1")
    assert parse_root("mem:b1") == PosixRoot("mem:b1"), "a scheme without // is a path unless its backend says so"


def test_the_capability_probe_tries_the_new_backend(mem_backend: Backend) -> None:
    caps = detect_capabilities(open_storage("mem://caps"), refresh=True)
    assert {c.name for c in caps.checks if c.ok} == set(ALL_CAPABILITIES)
    assert "(a dict lookup)" in caps.get("conditional_create").detail
    assert _BUCKETS["caps"] == {}, "the sentinels are removed"


def test_admission_and_the_probe_reach_the_new_backend(mem_backend: Backend, tmp_path: Path) -> None:
    shape = shape_checkpoint(PRESETS["mlperf-llama3-405b"].spec())
    budget = plan_burst(shape, StoreLimits(write_bytes_per_s=300 * 2**30), Schedule(interval_s=3600))
    # Not a directory: residency is checked by default, and a public bucket refused, as for any object store.
    refused = admit(budget, root="mem://public-ckpt")
    assert any(r.startswith("residency:") and "public-ckpt" in r for r in refused.reasons)
    assert refused.free_bytes is None, "no volume checks for a root that is not a directory"
    assert not any(r.startswith("residency:") for r in admit(budget, root="mem://private-ckpt").reasons)
    outside = admit(budget, root="mem://private-ckpt", residency=Residency(allowed_regions=["eu-west-1"]))
    assert any("mem-1" in r for r in outside.reasons)
    caps = target_capabilities("mem://probed")
    assert caps.conditional_writes and caps.url == "mem://probed"
