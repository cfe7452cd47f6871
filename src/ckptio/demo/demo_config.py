"""What ``ckptio demo`` can be told: :class:`DemoConfig`, validated on construction, and the ``--quick`` preset.

The CLI builds it from its arguments and the tests build it directly; :mod:`ckptio.demo.demo_runner` runs it. A
value the demo cannot run with is a :class:`~ckptio.errors.ConfigError` naming the flag, before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ckptio.demo.model import ModelShape
from ckptio.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class DemoConfig:
    """Everything ``ckptio demo`` can be told."""

    ranks: int = 2
    """Ranks of the job (gloo on CPU, 127.0.0.1)."""

    saves: int = 5
    """Saves per run when ``steps`` is not given: the first (reported apart) and the steady ones."""

    every: int | None = None
    """Save every this many steps; None lets the planner pick the shortest interval at which the flush keeps
    up with headroom (never at the last step, so the resume has a step to compare)."""

    steps: int | None = None
    """Training steps per run; None trains ``(saves + 1) × every`` (a full interval after the last save)."""

    store_bandwidth: float = 200 * 2**20
    """Write bandwidth of the emulated shared store, bytes/s, shared by every rank and writer."""

    store: Literal["posix", "s3"] = "posix"
    """``posix``: a directory under ``out``; ``s3``: ckptio writes to an embedded moto S3 server."""

    out: str = "ckptio-demo"
    """Working directory: stores, events, logs, report."""

    shape: ModelShape = field(default_factory=ModelShape)
    """Model size (``--quick`` uses a small one)."""

    seed: int = 0
    """Seed of the model and data."""

    fsync: bool = True
    """fsync checkpoint files in every mode, as a real filesystem client would."""

    timeout_s: float = 600.0
    """Longest one run may take before its ranks are ended."""

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ConfigError(f"--ranks must be >= 1, got {self.ranks}")
        if self.saves < 2:
            raise ConfigError(f"--saves must be >= 2 (the first and a steady one), got {self.saves}")
        if self.every is not None and self.every < 1:
            raise ConfigError(f"--every must be >= 1, got {self.every}")
        if self.steps is not None and self.steps < 2:
            raise ConfigError(f"--steps must be >= 2, got {self.steps}")
        if self.every is not None and self.steps is not None and self.steps <= self.every:
            raise ConfigError(f"need --steps > --every (got steps={self.steps}, every={self.every})")
        if self.store_bandwidth <= 0:
            raise ConfigError("--store-bandwidth must be positive")
        if self.store not in ("posix", "s3"):
            raise ConfigError(f"--store must be posix or s3, got {self.store!r}")
        if self.shape.vocab % self.ranks:
            raise ConfigError(f"the model's vocab ({self.shape.vocab}) must divide over {self.ranks} ranks")

    def with_every(self, every: int) -> DemoConfig:
        """This configuration at ``every``, with its steps resolved."""
        return replace(self, every=every, steps=self.steps or (self.saves + 1) * every)


QUICK = DemoConfig(
    store_bandwidth=96 * 2**20,
    shape=ModelShape(vocab=16_384, d_model=128, layers=1, heads=2, seq_len=64, batch=8),
)
"""``--quick``: a 27 MiB checkpoint; the saves still dominate the step time."""
