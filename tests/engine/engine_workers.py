"""Helpers for the engine tests: deterministic states and their comparison.

Ranks are launched by ``ckptio.testing.ranks``.
"""

from __future__ import annotations

from typing import Any

import torch

from ckptio.testing.ranks import run_ranks

__all__ = ["assert_same", "model_state", "run_ranks"]


def model_state(seed: int, width: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(width, width, generator=g),
        "b": torch.randn(width, generator=g),
        "emb": torch.randn(4 * width, 8, generator=g).to(torch.bfloat16),
    }


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where} keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
