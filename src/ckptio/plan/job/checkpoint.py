"""One checkpoint of a job: how many bytes and objects each rank writes, from the job's description alone.

Owns the arithmetic from "a 405B model, bf16 weights, mixed-precision Adam, TP 8 × PP 32, ZeRO-1 on 512
ranks" to rank classes (ranks that write the same number of bytes); the named jobs are :mod:`.presets`. It must
never touch storage or time: bandwidths and intervals belong to :mod:`ckptio.plan.costs`.

Who writes what (the rule every framework in this family follows):

* TP splits every tensor of a pipeline stage evenly across its TP ranks.
* PP gives each stage a contiguous slice of layers; with an architecture, the embedding sits on the first
  stage and the final norm + LM head on the last (without one, parameters split evenly across stages).
* ZeRO-0: weights and optimizer state are replicated across DP; only the first DP replica writes them.
  ZeRO-1/2: weights replicated (first DP replica writes them), optimizer state sharded across DP (all write).
  ZeRO-3: both sharded across DP; every rank writes an equal share.
* Every rank writes its extra bytes (RNG, data loader state, …) and its own index; the checkpoint adds three
  small objects (``.metadata``, ``manifest.json``, ``latest``).

Who needs what back (the restore's side, :class:`ReplicaGroup`): every rank needs what its DP replica holds, so the
bytes one DP rank wrote for a replicated tensor are needed by every rank of its TP × PP position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ckptio.errors import ConfigError

WEIGHT_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per parameter of the saved weights, by dtype name."""

OPTIMIZER_BYTES_PER_PARAM = {"adam-mixed": 12, "adam-fp32": 8, "sgd-momentum": 4, "none": 0}
"""Optimizer state bytes per parameter: adam-mixed keeps an fp32 master copy and two fp32 moments; adam-fp32
two fp32 moments (the weights are the fp32 copy); sgd-momentum one fp32 buffer."""

# Objects every checkpoint adds beyond the ranks' own: .metadata, manifest.json, latest.
CHECKPOINT_LEVEL_OBJECTS = 3


@dataclass(kw_only=True, slots=True, frozen=True)
class Architecture:
    """A decoder-only transformer, counted as MLPerf Storage's DLIO counts it (its llama3 workload configs)."""

    layers: int
    """Transformer blocks."""

    hidden: int
    """Model (embedding) width."""

    ffn: int
    """Width of the gated MLP's inner layer."""

    heads: int
    """Attention heads; the head width is ``hidden // heads`` (floor, as DLIO counts it)."""

    kv_heads: int
    """Key/value heads (grouped-query attention); equal to ``heads`` for plain multi-head attention."""

    vocab: int
    """Vocabulary size (embedding and LM head rows)."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab"):
            if getattr(self, name) < 1:
                raise ConfigError(f"architecture {name} must be >= 1, got {getattr(self, name)}")
        if self.kv_heads > self.heads:
            raise ConfigError(f"kv_heads ({self.kv_heads}) cannot exceed heads ({self.heads})")

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        """One block: input norm, fused QKV, output projection, second norm, gated MLP (three matrices)."""
        kv_dim = (self.hidden // self.heads) * self.kv_heads
        return (
            self.hidden
            + self.hidden * (self.hidden + 2 * kv_dim)
            + self.hidden * self.hidden
            + self.hidden
            + 3 * self.ffn * self.hidden
        )

    @property
    def head_params(self) -> int:
        """Final norm and LM head (untied from the embedding)."""
        return self.hidden + self.embedding_params

    @property
    def params(self) -> int:
        return self.embedding_params + self.layer_params * self.layers + self.head_params


@dataclass(kw_only=True, slots=True, frozen=True)
class Parallelism:
    """How ranks split the model: tensor × pipeline × data parallel, and the ZeRO stage of DP."""

    tp: int = 1
    """Tensor-parallel degree."""

    pp: int = 1
    """Pipeline-parallel degree (stages)."""

    dp: int = 1
    """Data-parallel degree (replicas, or shards under ZeRO)."""

    zero: int = 0
    """ZeRO stage 0–3 (FSDP full sharding is 3, optimizer-only sharding is 1)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"zero stage must be 0, 1, 2 or 3, got {self.zero}")

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @classmethod
    def for_ranks(
        cls, *, ranks: int | None, tp: int = 1, pp: int = 1, dp: int | None = None, zero: int = 0
    ) -> Parallelism:
        """Fill in ``dp`` from ``ranks`` (or check that they agree)."""
        if tp < 1 or pp < 1:
            raise ConfigError(f"tp and pp must be >= 1, got tp={tp} pp={pp}")
        if dp is None:
            if ranks is None:
                ranks = tp * pp
            if ranks % (tp * pp):
                raise ConfigError(f"ranks ({ranks}) must be a multiple of tp × pp ({tp} × {pp})")
            dp = ranks // (tp * pp)
        elif ranks is not None and ranks != tp * pp * dp:
            raise ConfigError(f"ranks ({ranks}) != tp × pp × dp ({tp} × {pp} × {dp})")
        return cls(tp=tp, pp=pp, dp=dp, zero=zero)


@dataclass(kw_only=True, slots=True)
class CheckpointSpec:
    """What one checkpoint of a job holds, from the job's description (no storage, no timing)."""

    params: float | None = None
    """Parameter count; derived from ``architecture`` when None."""

    architecture: Architecture | None = None
    """Transformer shape: the parameter count, and which PP stages hold the embedding and LM head."""

    weights_dtype: str = "bf16"
    """dtype of the saved weights: one of :data:`WEIGHT_DTYPE_BYTES`."""

    optimizer: str = "adam-mixed"
    """Optimizer whose state is saved: one of :data:`OPTIMIZER_BYTES_PER_PARAM`."""

    extra_bytes_per_rank: float = 0.0
    """Bytes every rank saves besides model and optimizer (RNG states, data loader state, …)."""

    parallelism: Parallelism = field(default_factory=Parallelism)
    """TP × PP × DP and the ZeRO stage."""

    file_size_bytes: float = float(1 << 30)
    """Target size of one data file (coalesced small tensors, chunked large ones): sets objects per rank."""

    part_size_bytes: float = float(64 << 20)
    """Multipart part size on object stores: a file larger than this costs ceil(size/part) + 2 requests."""

    def __post_init__(self) -> None:
        if self.params is None and self.architecture is None:
            raise ConfigError("give a parameter count or an architecture")
        if self.params is not None and (not math.isfinite(self.params) or self.params <= 0):
            raise ConfigError(f"params must be > 0, got {self.params}")
        if self.weights_dtype not in WEIGHT_DTYPE_BYTES:
            raise ConfigError(
                f"weights dtype must be one of {sorted(WEIGHT_DTYPE_BYTES)}, got {self.weights_dtype!r}"
            )
        if self.optimizer not in OPTIMIZER_BYTES_PER_PARAM:
            raise ConfigError(
                f"optimizer must be one of {sorted(OPTIMIZER_BYTES_PER_PARAM)}, got {self.optimizer!r}"
            )
        if self.extra_bytes_per_rank < 0:
            raise ConfigError(f"extra bytes must be >= 0, got {self.extra_bytes_per_rank}")
        if self.file_size_bytes < 1 << 20 or self.part_size_bytes < 1 << 20:
            raise ConfigError("file size and part size must be at least 1 MiB")
        if self.architecture is not None and self.architecture.layers < self.parallelism.pp:
            raise ConfigError(
                f"{self.architecture.layers} layers cannot fill {self.parallelism.pp} pipeline stages"
            )

    @property
    def param_count(self) -> float:
        if self.params is not None:
            return self.params
        assert self.architecture is not None  # __post_init__ guarantees one of the two
        return float(self.architecture.params)

    def stage_params(self) -> list[float]:
        """Parameters held by each pipeline stage (summing to :attr:`param_count`)."""
        pp = self.parallelism.pp
        arch = self.architecture
        if arch is None or self.params is not None:
            return [self.param_count / pp] * pp
        base, extra = divmod(arch.layers, pp)
        stages = [float((base + (1 if s < extra else 0)) * arch.layer_params) for s in range(pp)]
        stages[0] += arch.embedding_params
        stages[-1] += arch.head_params
        return stages


@dataclass(kw_only=True, slots=True, frozen=True)
class RankClass:
    """Ranks that write the same bytes in every checkpoint (the planner and the simulator work per class)."""

    count: int
    """How many ranks are in this class."""

    data_bytes: float
    """Model and optimizer bytes each rank of the class writes."""

    extra_bytes: float
    """Extra bytes each rank writes."""

    files: int
    """Data files each rank writes."""

    objects: int
    """Objects each rank creates: its data files and its index."""

    requests: int
    """Object-store write requests of each rank (a large file: create + parts + complete)."""

    @property
    def bytes(self) -> float:
        return self.data_bytes + self.extra_bytes


@dataclass(kw_only=True, slots=True, frozen=True)
class ReplicaGroup:
    """Ranks that restore the same stored bytes: the data-parallel ranks of one TP × PP position."""

    count: int
    """How many groups are alike (the TP ranks of a pipeline stage)."""

    ranks: int
    """Ranks in each group (the DP degree)."""

    shared_bytes: float
    """Bytes the group's first rank writes that every rank of the group needs back: the weights under ZeRO-1/2,
    weights and optimizer state under ZeRO-0."""

    own_bytes: float
    """Bytes each rank of the group writes and alone needs back: its optimizer shard (ZeRO-1/2), its share of
    everything (ZeRO-3), its extra bytes."""


@dataclass(kw_only=True, slots=True, frozen=True)
class CheckpointShape:
    """One checkpoint of the job: totals and the rank classes that add up to them."""

    params: float
    """Parameter count of the model."""

    ranks: int
    """Ranks in the job (TP × PP × DP)."""

    classes: tuple[RankClass, ...]
    """Rank classes, largest writer first; their counts sum to :attr:`ranks`."""

    dtensor_share: float = 0.0
    """Share of a rank's bytes held in DTensors: 1 for a sharded job (tensor parallel, or sharded data parallel
    as torch's FSDP2 does it). DCP's default staging copies a DTensor more times than a plain tensor
    (:func:`ckptio.plan.costs.background.predict_modes`)."""

    groups: tuple[ReplicaGroup, ...] = ()
    """Who needs which stored bytes back; empty: every rank needs exactly what it wrote (:meth:`replica_groups`)."""

    def replica_groups(self) -> tuple[ReplicaGroup, ...]:
        """:attr:`groups`, or one group of one rank per rank when none were given."""
        return self.groups or tuple(ReplicaGroup(count=c.count, ranks=1, shared_bytes=0.0, own_bytes=c.bytes)
                                    for c in self.classes)

    @property
    def total_bytes(self) -> float:
        return sum(c.count * c.bytes for c in self.classes)

    @property
    def bytes_per_rank_max(self) -> float:
        return max(c.bytes for c in self.classes)

    @property
    def writers(self) -> int:
        """Ranks that write model or optimizer bytes (the others write only extras and an index)."""
        return sum(c.count for c in self.classes if c.data_bytes > 0)

    @property
    def objects(self) -> int:
        return sum(c.count * c.objects for c in self.classes) + CHECKPOINT_LEVEL_OBJECTS

    @property
    def requests(self) -> int:
        return sum(c.count * c.requests for c in self.classes) + CHECKPOINT_LEVEL_OBJECTS


def shape_checkpoint(model: CheckpointSpec) -> CheckpointShape:
    """Assign the checkpoint's bytes to ranks (see the module docstring for the rule)."""
    par = model.parallelism
    weight_b = WEIGHT_DTYPE_BYTES[model.weights_dtype]
    optim_b = OPTIMIZER_BYTES_PER_PARAM[model.optimizer]
    counts: dict[int, int] = {}
    groups: dict[tuple[int, int], int] = {}
    for stage in model.stage_params():
        per_tp = stage / par.tp
        if par.zero == 0:
            shared, own = (weight_b + optim_b) * per_tp, 0.0
        elif par.zero in (1, 2):
            shared, own = weight_b * per_tp, optim_b * per_tp / par.dp
        else:
            shared, own = 0.0, (weight_b + optim_b) * per_tp / par.dp
        # The first DP replica writes the shared bytes and its own; the others their own.
        first, others = shared + own, own
        # Whole bytes as keys: stages that differ only by float noise form one class.
        counts[round(first)] = counts.get(round(first), 0) + par.tp
        if par.dp > 1:
            counts[round(others)] = counts.get(round(others), 0) + par.tp * (par.dp - 1)
        key = (round(shared), round(own + model.extra_bytes_per_rank))
        groups[key] = groups.get(key, 0) + par.tp
    classes = [_rank_class(count, float(data), model) for data, count in counts.items()]
    classes.sort(key=lambda c: c.bytes, reverse=True)
    sharded = par.tp > 1 or (par.zero > 0 and par.dp > 1)
    return CheckpointShape(
        params=model.param_count, ranks=par.ranks, classes=tuple(classes), dtensor_share=1.0 if sharded else 0.0,
        groups=tuple(ReplicaGroup(count=count, ranks=par.dp, shared_bytes=float(shared), own_bytes=float(own))
                     for (shared, own), count in groups.items()))


def uniform_shape(
    *,
    ranks: int,
    bytes_per_rank: float,
    file_size_bytes: float = float(1 << 30),
    part_size_bytes: float = float(64 << 20),
) -> CheckpointShape:
    """A checkpoint in which every one of ``ranks`` ranks writes ``bytes_per_rank`` (benchmarks, demos, tests)."""
    model = CheckpointSpec(
        params=bytes_per_rank * ranks / WEIGHT_DTYPE_BYTES["fp32"],
        weights_dtype="fp32",
        optimizer="none",
        parallelism=Parallelism(dp=ranks, zero=3),
        file_size_bytes=file_size_bytes,
        part_size_bytes=part_size_bytes,
    )
    return shape_checkpoint(model)


def _rank_class(count: int, data_bytes: float, model: CheckpointSpec) -> RankClass:
    written = data_bytes + model.extra_bytes_per_rank
    full, rest = divmod(written, model.file_size_bytes)
    # A remainder under one byte is float noise from dividing parameters across ranks, not a file.
    sizes = [model.file_size_bytes] * int(full) + ([rest] if rest >= 1 else [])
    requests = sum(_requests_for(size, model.part_size_bytes) for size in sizes) + 1
    return RankClass(
        count=count,
        data_bytes=data_bytes,
        extra_bytes=model.extra_bytes_per_rank,
        files=len(sizes),
        objects=len(sizes) + 1,
        requests=requests,
    )


def _requests_for(size: float, part_size: float) -> int:
    """PUT-class requests to write one object: one PUT, or create + parts + complete."""
    return 1 if size <= part_size else math.ceil(size / part_size) + 2
