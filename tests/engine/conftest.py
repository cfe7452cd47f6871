"""Engine test fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture
def root(tmp_path):
    """A fresh durable root on the work disk."""
    path = tmp_path / "ckpt"
    path.mkdir()
    return str(path)
