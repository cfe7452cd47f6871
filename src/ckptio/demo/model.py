"""The demo's training job: a small transformer whose bytes sit in a vocab-parallel embedding, and its state.

Compute is kept cheap (two small blocks, a short sequence) while the checkpoint is large: the embedding
table is sharded by rows over the ranks (each rank owns ``vocab / world`` rows, like Megatron's
vocab-parallel embedding), and with Adam's two moments the saved state is about 12 bytes per embedding
parameter. Every rank sees the same batch, so the replicated blocks stay bit-identical without a gradient
all-reduce; only the embedding output is summed across ranks. Everything is seeded so that a resumed run
reproduces the uninterrupted one bit for bit.

This module must never touch storage or checkpointing: it only builds the model, the data and the state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from ckptio.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class ModelShape:
    """Sizes of the demo model and its synthetic data."""

    vocab: int = 102_400
    """Rows of the embedding table (split evenly over the ranks): where the checkpoint's bytes live."""

    d_model: int = 256
    """Width of the embedding and of the transformer blocks."""

    layers: int = 2
    """Transformer blocks (replicated on every rank)."""

    heads: int = 4
    """Attention heads per block."""

    seq_len: int = 64
    """Tokens per sample."""

    batch: int = 8
    """Samples per step (the same batch on every rank)."""

    classes: int = 512
    """Output classes: the next token modulo this (keeps the head, and so the compute, small)."""

    pool: int = 16
    """Distinct synthetic batches, cycled, so the loss visibly falls as the model memorises them."""

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "layers", "heads", "seq_len", "batch", "classes", "pool"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model {name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise ConfigError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")

    def sharded_bytes(self) -> int:
        """Bytes of the embedding table with its two Adam moments: the part of the state saved as DTensors."""
        return 12 * self.vocab * self.d_model

    def state_items(self) -> int:
        """Entries of one rank's flattened state: each parameter (the embedding's local rows, a pre-norm block's 12,
        the head's 2), its Adam ``step`` and two moments, and the step. DCP's saves pay per entry as well as per
        byte (:attr:`ckptio.plan.costs.background.WriterCosts.dcp_items_per_s`)."""
        return 4 * (1 + 12 * self.layers + 2) + 1

    def state_bytes(self) -> int:
        """Bytes of the whole checkpoint (all ranks): fp32 parameters plus Adam's two moments."""
        block = self.layers * (12 * self.d_model * self.d_model + 13 * self.d_model)
        params = self.vocab * self.d_model + block + self.d_model * self.classes + self.classes
        return 12 * params


class _SumAcrossRanks(torch.autograd.Function):
    """All-reduce in the forward pass, identity in the backward pass.

    Every rank computes the same loss from the summed embedding, so the gradient reaching each rank's rows is
    already the full one; summing it again (``torch.distributed.nn.all_reduce`` does) would scale it by world.
    """

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor) -> torch.Tensor:
        out = partial.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class VocabParallelEmbedding(nn.Module):
    """Rows ``[rank * rows, (rank + 1) * rows)`` of a ``vocab × dim`` table; looks up every token, summed."""

    def __init__(self, vocab: int, dim: int, *, rank: int, world: int, seed: int) -> None:
        super().__init__()
        if vocab % world:
            raise ConfigError(f"vocab {vocab} is not divisible by {world} ranks")
        self.rows = vocab // world
        self.first_row = rank * self.rows
        self.world = world
        # Seeded per shard, so the table does not depend on the order ranks start in.
        generator = torch.Generator().manual_seed(seed * 7919 + rank)
        self.weight = nn.Parameter(torch.randn(self.rows, dim, generator=generator) * 0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first_row
        mine = (local >= 0) & (local < self.rows)
        found = F.embedding(local.clamp(0, self.rows - 1), self.weight) * mine.unsqueeze(-1)
        return _SumAcrossRanks.apply(found) if self.world > 1 else found


class DemoModel(nn.Module):
    """Embedding → a few pre-norm transformer blocks → a small classification head."""

    def __init__(self, shape: ModelShape, *, rank: int, world: int, seed: int) -> None:
        super().__init__()
        self.embed = VocabParallelEmbedding(shape.vocab, shape.d_model, rank=rank, world=world, seed=seed)
        torch.manual_seed(seed)  # the replicated part is identical on every rank
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                shape.d_model,
                shape.heads,
                dim_feedforward=4 * shape.d_model,
                dropout=0.0,
                batch_first=True,
                norm_first=True,
            )
            for _ in range(shape.layers)
        )
        self.head = nn.Linear(shape.d_model, shape.classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = block(hidden)
        logits: torch.Tensor = self.head(hidden)
        return logits


def batch_for_step(shape: ModelShape, step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed synthetic batch of a (1-based) step: inputs and next-token class targets."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + (step - 1) % shape.pool)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq_len + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:] % shape.classes


class Trainer:
    """Model, Adam and the step counter of one rank; ``train_step`` runs one deterministic step."""

    def __init__(self, shape: ModelShape, *, rank: int, world: int, seed: int, lr: float = 1e-3) -> None:
        self.shape = shape
        self.seed = seed
        self.model = DemoModel(shape, rank=rank, world=world, seed=seed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, fused=True)
        self._init_optimizer_state()
        self.step = 0

    def _init_optimizer_state(self) -> None:
        # Adam creates its moments lazily on the first step; creating them now gives save and restore the same
        # structure from step 0, so a fresh process can restore in place before it has trained at all.
        for param in self.model.parameters():
            self.optimizer.state[param] = {
                "step": torch.zeros((), dtype=torch.float32),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }

    def train_step(self, before_update: Callable[[], object] | None = None) -> float:
        """Run step ``self.step + 1``; returns its loss. ``before_update`` runs before the optimizer step, the
        first write to the saved state (where an async save's staging copy must be done)."""
        self.step += 1
        inputs, targets = batch_for_step(self.shape, self.step, self.seed)
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, self.shape.classes), targets.reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if before_update is not None:
            before_update()
        self.optimizer.step()
        return float(loss.detach())


class TrainState(Stateful):
    """The checkpointed state: parameters, Adam moments, the step; embedding rows as ``Shard(0)`` DTensors.

    The DTensors wrap the live tensors (no copy), so a checkpoint load writes straight into the model.
    Plain tensors are replicated: DCP writes each of them once, from one rank.
    """

    def __init__(self, trainer: Trainer, mesh: DeviceMesh | None) -> None:
        self.trainer = trainer
        self.mesh = mesh

    def _wrap(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.mesh is None or not name.startswith("embed."):
            return tensor
        full = (self.trainer.shape.vocab, tensor.shape[1])
        return DTensor.from_local(tensor, self.mesh, [Shard(0)], shape=torch.Size(full), stride=(full[1], 1))

    def state_dict(self) -> dict[str, Any]:
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        state = self.trainer.optimizer.state
        for name, param in self.trainer.model.named_parameters():
            model[name] = self._wrap(name, param.detach())
            moments = state[param]
            optim[name] = {
                "step": moments["step"],
                "exp_avg": self._wrap(name, moments["exp_avg"]),
                "exp_avg_sq": self._wrap(name, moments["exp_avg_sq"]),
            }
        return {"model": model, "optim": optim, "step": self.trainer.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A DCP-style load fills the tensors of state_dict() in place (they alias the live ones); copy anyway
        # when a loader handed back fresh tensors, so the model never silently keeps its old values.
        live = self.state_dict()
        _copy_into(live["model"], state_dict["model"])
        _copy_into(live["optim"], state_dict["optim"])
        self.trainer.step = int(state_dict["step"])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _copy_into(live: dict[str, Any], loaded: dict[str, Any]) -> None:
    for key, value in live.items():
        if isinstance(value, dict):
            _copy_into(value, loaded[key])
            continue
        target, source = _local(value), _local(loaded[key])
        if target.data_ptr() != source.data_ptr():
            with torch.no_grad():
                target.copy_(source)
