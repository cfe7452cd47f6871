"""Fixtures of the writer's one-process tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptio.engine.writer.pipeline import Writer
from tests.engine.writer.harness import Inbox


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    path.mkdir()
    return path


@pytest.fixture
def writers() -> Iterator[list[Writer]]:
    """Writers a test starts; each is closed at the end (its committer threads joined)."""
    started: list[Writer] = []
    yield started
    for writer in started:
        writer.close()


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()
