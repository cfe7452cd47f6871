"""The capability half of the storage conformance kit: declared capabilities, the marker, and the probe's check.

A backend's test class (a :class:`~ckptio.testing.conformance.StoreTests` subclass) declares what its store
honours in ``capabilities``. Tests marked ``@requires_capability(name)`` skip, with the reason, for a backend that
declares it lacks ``name``; :meth:`CapabilityTests.test_capabilities_are_detected_as_declared` asserts the probe
(:func:`ckptio.storage.capabilities.detect_capabilities`) finds exactly the declaration, so a declaration can
neither hide a missing guarantee nor invent one. Never imports the engine.
"""

from __future__ import annotations

import pytest

from ckptio.errors import StoreCapabilityError
from ckptio.storage.base import Exposure, Storage
from ckptio.storage.capabilities import (
    ALL_CAPABILITIES,
    PUBLIC_ACCESS_API,
    REGION_API,
    SENTINEL_DIR,
    detect_capabilities,
)

__all__ = ["CapabilityTests", "pytest_configure", "requires_capability"]

#: ``@requires_capability(name, ...)``: the test needs these capabilities of the store under test.
requires_capability = pytest.mark.requires_capability


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker (this hook runs through the conformance plugin, which re-exports it)."""
    config.addinivalue_line(
        "markers",
        "requires_capability(*names): the conformance test needs these store capabilities "
        "(ckptio.storage.capabilities); it skips for a backend whose `capabilities` lack one",
    )


class CapabilityTests:
    """Mixed into StoreTests: subclasses provide a ``storage`` fixture and may narrow ``capabilities``."""

    #: What this backend's store honours; a subclass for a store that lacks some declares the rest.
    capabilities: frozenset[str] = frozenset(ALL_CAPABILITIES)

    @pytest.fixture(autouse=True)
    def _skip_without_capability(self, request: pytest.FixtureRequest) -> None:
        for marker in request.node.iter_markers("requires_capability"):
            lacking = sorted(set(marker.args) - self.capabilities)
            if lacking:
                pytest.skip(f"{type(self).__name__} declares its store lacks {', '.join(lacking)}")

    def test_capabilities_are_detected_as_declared(self, storage: Storage) -> None:
        caps = detect_capabilities(storage, refresh=True)
        assert {c.name: c.ok for c in caps.checks} == {n: n in self.capabilities for n in ALL_CAPABILITIES}, caps
        assert all(c.detail for c in caps.checks)
        assert list(storage.list(SENTINEL_DIR)) == [], "the probe removes its sentinel objects"
        assert detect_capabilities(storage) is caps, "cached per store"

    def test_placement_is_readable_or_a_named_error(self, storage: Storage) -> None:
        if REGION_API in self.capabilities:
            region = storage.region
            assert region is None or (isinstance(region, str) and region)
        else:
            with pytest.raises(StoreCapabilityError, match="region"):
                storage.region  # noqa: B018 - the property read is the test
        if PUBLIC_ACCESS_API in self.capabilities:
            exposure = storage.public_exposure()
            assert isinstance(exposure, Exposure) and exposure.detail
        else:
            with pytest.raises(StoreCapabilityError, match="does not implement"):
                storage.public_exposure()
