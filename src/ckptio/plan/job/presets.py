"""Named jobs: MLPerf Storage v2.0's checkpointing workloads (the DLIO ``llama3_*.yaml`` configs of mlcommons/storage),
with their architecture, parallelism and dtypes exactly as the benchmark defines them. Must never add a job the
benchmark does not define: a preset is a figure others can reproduce."""

from __future__ import annotations

from dataclasses import dataclass

from ckptio.errors import ConfigError
from ckptio.plan.job.checkpoint import Architecture, CheckpointSpec, Parallelism


@dataclass(kw_only=True, slots=True, frozen=True)
class Preset:
    """A named job: architecture, parallelism and dtypes exactly as a public benchmark defines them."""

    name: str
    """Name on the command line."""

    architecture: Architecture
    """Model shape."""

    parallelism: Parallelism
    """TP × PP × DP and ZeRO stage."""

    weights_dtype: str = "fp16"
    """Saved weight dtype."""

    optimizer: str = "adam-mixed"
    """Saved optimizer state."""

    def spec(self, **overrides: object) -> CheckpointSpec:
        """This job as a :class:`CheckpointSpec`; ``overrides`` that are not None replace its fields."""
        fields: dict[str, object] = {
            "architecture": self.architecture,
            "parallelism": self.parallelism,
            "weights_dtype": self.weights_dtype,
            "optimizer": self.optimizer,
        }
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return CheckpointSpec(**fields)  # type: ignore[arg-type]


def _llama3(name: str, arch: tuple[int, ...], *, tp: int, pp: int, zero: int, ranks: int) -> Preset:
    layers, hidden, ffn, heads, kv_heads, vocab = arch
    return Preset(
        name=name,
        architecture=Architecture(
            layers=layers, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, vocab=vocab
        ),
        parallelism=Parallelism.for_ranks(ranks=ranks, tp=tp, pp=pp, zero=zero),
    )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _llama3("mlperf-llama3-8b", (32, 4096, 14336, 32, 8, 128256), tp=1, pp=1, zero=3, ranks=8),
        _llama3("mlperf-llama3-70b", (80, 8192, 28672, 128, 8, 128256), tp=8, pp=1, zero=3, ranks=64),
        _llama3("mlperf-llama3-405b", (126, 16384, 53248, 128, 8, 128256), tp=8, pp=32, zero=1, ranks=512),
        _llama3("mlperf-llama3-1t", (128, 25872, 98304, 192, 32, 128256), tp=8, pp=64, zero=1, ranks=1024),
    )
}
"""MLPerf Storage v2.0 checkpointing workloads (DLIO ``llama3_*.yaml``)."""


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
