"""The checkpoint model: MLPerf Storage sizes, and who writes what under TP, PP, DP and ZeRO."""

from __future__ import annotations

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.job.checkpoint import (
    CHECKPOINT_LEVEL_OBJECTS,
    Architecture,
    CheckpointSpec,
    Parallelism,
    shape_checkpoint,
    uniform_shape,
)
from ckptio.plan.job.presets import preset

GIB = 2**30






def _shape(zero: int, *, tp: int = 2, pp: int = 1, dp: int = 2, params: float = 1000.0) -> dict[float, int]:
    model = CheckpointSpec(
        params=params,
        weights_dtype="bf16",
        optimizer="adam-mixed",
        parallelism=Parallelism(tp=tp, pp=pp, dp=dp, zero=zero),
    )
    return {c.bytes: c.count for c in shape_checkpoint(model).classes}


def test_zero0_only_the_first_replica_writes() -> None:
    # 1000 params × 14 B; TP 2 halves each tensor; the DP replica 1 holds copies and writes nothing.
    assert _shape(0) == {7000.0: 2, 0.0: 2}


def test_zero1_weights_from_the_first_replica_optimizer_from_all() -> None:
    # first replica: 2 B × 500 + 12 B × 500 / 2; other replica: 12 B × 500 / 2
    assert _shape(1) == {4000.0: 2, 3000.0: 2}
    assert _shape(2) == _shape(1)  # gradients are not saved: ZeRO-2 writes what ZeRO-1 writes


def test_zero3_every_rank_writes_an_equal_share() -> None:
    assert _shape(3) == {3500.0: 4}


@pytest.mark.parametrize(
    ("parallelism", "share"),
    [(Parallelism(dp=4), 0.0), (Parallelism(pp=4), 0.0), (Parallelism(tp=2), 1.0), (Parallelism(dp=4, zero=3), 1.0),
     (Parallelism(dp=4, zero=1), 1.0), (Parallelism(dp=1, zero=3), 0.0)],
)
def test_a_sharded_job_saves_dtensors(parallelism: Parallelism, share: float) -> None:
    model = CheckpointSpec(params=1e6, weights_dtype="fp32", optimizer="adam-fp32", parallelism=parallelism)
    assert shape_checkpoint(model).dtensor_share == share


def test_pipeline_stages_hold_embedding_first_and_lm_head_last() -> None:
    # head width 4, kv_dim 4: per layer 8 + 8×16 + 64 + 8 + 3×16×8 = 592; embedding 80; final norm + head 88.
    arch = Architecture(layers=4, hidden=8, ffn=16, heads=2, kv_heads=1, vocab=10)
    assert (arch.layer_params, arch.embedding_params, arch.head_params, arch.params) == (592, 80, 88, 2536)
    model = CheckpointSpec(
        architecture=arch, weights_dtype="fp32", optimizer="none", parallelism=Parallelism(pp=2)
    )
    assert model.stage_params() == [2 * 592 + 80, 2 * 592 + 88]
    shape = shape_checkpoint(model)
    assert [(c.count, c.bytes) for c in shape.classes] == [(1, 4 * 1272.0), (1, 4 * 1264.0)]
    assert shape.bytes_per_rank_max == 4 * 1272


def test_uneven_layers_give_the_first_stages_one_more() -> None:
    arch = Architecture(layers=5, hidden=8, ffn=16, heads=2, kv_heads=1, vocab=10)
    model = CheckpointSpec(architecture=arch, parallelism=Parallelism(pp=2))
    assert model.stage_params() == [3 * 592 + 80, 2 * 592 + 88]


def test_tp_and_pp_split_a_parameter_count_evenly() -> None:
    assert _shape(3, tp=4, pp=2, dp=1, params=8000.0) == {14.0 * 1000: 8}


def test_objects_and_requests_follow_file_and_part_size() -> None:
    mib = 2**20
    model = CheckpointSpec(
        params=10 * mib / 4,  # 10 MiB of fp32 weights on one rank
        weights_dtype="fp32",
        optimizer="none",
        file_size_bytes=4 * mib,
        part_size_bytes=mib,
    )
    shape = shape_checkpoint(model)
    (only,) = shape.classes
    assert only.files == 3  # 4 + 4 + 2 MiB
    assert only.objects == 4  # and the rank index
    assert only.requests == (4 + 2) + (4 + 2) + (2 + 2) + 1  # create + parts + complete per file, index PUT
    assert shape.objects == 4 + CHECKPOINT_LEVEL_OBJECTS


def test_extra_bytes_go_to_every_rank_even_those_without_model_state() -> None:
    model = CheckpointSpec(params=1000, extra_bytes_per_rank=100, parallelism=Parallelism(dp=2, zero=0))
    shape = shape_checkpoint(model)
    assert sorted(c.bytes for c in shape.classes) == [100.0, 14100.0]
    assert shape.writers == 1


def test_for_ranks_derives_dp_and_checks_consistency() -> None:
    assert Parallelism.for_ranks(ranks=512, tp=8, pp=32, zero=1).dp == 2
    with pytest.raises(ConfigError, match="multiple"):
        Parallelism.for_ranks(ranks=100, tp=8, pp=1)
    with pytest.raises(ConfigError, match="!="):
        Parallelism.for_ranks(ranks=16, tp=2, pp=2, dp=2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"params": -1},
        {"params": 1e9, "weights_dtype": "int3"},
        {"params": 1e9, "optimizer": "lion"},
        {"params": 1e9, "extra_bytes_per_rank": -1},
        {"params": 1e9, "file_size_bytes": 10},
        {
            "architecture": Architecture(layers=2, hidden=8, ffn=8, heads=2, kv_heads=2, vocab=4),
            "parallelism": Parallelism(pp=4),
        },
    ],
)
def test_bad_models_raise_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        CheckpointSpec(**kwargs)  # type: ignore[arg-type]


def test_bad_parallelism_and_architecture() -> None:
    with pytest.raises(ConfigError):
        Parallelism(zero=4)
    with pytest.raises(ConfigError):
        Parallelism(tp=0)
    with pytest.raises(ConfigError):
        Architecture(layers=2, hidden=8, ffn=8, heads=2, kv_heads=4, vocab=4)
    with pytest.raises(ConfigError, match="known"):
        preset("llama-9000")


def test_uniform_shape_gives_every_rank_the_same_bytes() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=3 * GIB)
    assert [(c.count, c.bytes, c.files) for c in shape.classes] == [(4, 3.0 * GIB, 3)]
    assert shape.total_bytes == 12 * GIB
