"""A real checkpoint root (written once per session by a real Checkpointer and its writer process), copied fresh
for each test that tampers with it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ckptio


def pristine_state() -> dict:
    return {"w": torch.arange(16.0).reshape(4, 4), "lr": 0.1, "name": "x"}


@pytest.fixture(scope="session")
def pristine_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = str(tmp_path_factory.mktemp("pristine") / "ckpt")
    with ckptio.Checkpointer(root, keep_last=0, fsync=False) as ck:
        for step in (1, 2):
            ck.save(step, pristine_state()).wait(timeout=120)
    yield root


@pytest.fixture
def ckpt_root(pristine_root: str, tmp_path: Path) -> str:
    """A private copy of a root with committed steps 1 and 2 of :func:`pristine_state`."""
    root = str(tmp_path / "ckpt")
    shutil.copytree(pristine_root, root, symlinks=True)
    return root
