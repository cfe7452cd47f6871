"""The restore model: each stored byte read once, by the rank the engine's read plan picks; the rest sent on."""

from __future__ import annotations

import pytest

from ckptio.plan.costs import readback as model
from ckptio.plan.costs.inputs import Network
from ckptio.plan.costs.levels import LocalLevel
from ckptio.plan.costs.readback import ReadSource, durable_restore, group_shares, restore_time
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import CheckpointSpec, Parallelism, ReplicaGroup, shape_checkpoint, uniform_shape

GIB = float(1 << 30)
MIB = 1 << 20


def _replicated(dp: int, *, zero: int = 0, gib: float = 4.0, optimizer: str = "none") -> CheckpointSpec:
    """``gib`` GiB of fp32 weights on one TP × PP position, ``dp`` data-parallel replicas."""
    return CheckpointSpec(params=gib * GIB / 4, weights_dtype="fp32", optimizer=optimizer,
                          parallelism=Parallelism(dp=dp, zero=zero))


def test_the_job_says_who_needs_what_back() -> None:
    zero0 = shape_checkpoint(_replicated(4))
    assert zero0.groups == (ReplicaGroup(count=1, ranks=4, shared_bytes=4 * GIB, own_bytes=0.0),)
    # ZeRO-1: the weights are every replica's, each optimizer shard its own rank's (adam-fp32: 8 bytes per param).
    zero1 = shape_checkpoint(_replicated(2, zero=1, optimizer="adam-fp32"))
    assert zero1.groups == (ReplicaGroup(count=1, ranks=2, shared_bytes=4 * GIB, own_bytes=4 * GIB),)
    zero3 = uniform_shape(ranks=4, bytes_per_rank=GIB)
    assert zero3.groups == (ReplicaGroup(count=1, ranks=4, shared_bytes=0.0, own_bytes=GIB),)


def test_sharded_state_at_the_saved_world_size_reads_its_own_and_sends_nothing() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=GIB)
    time = restore_time(shape, ReadSource(bytes_per_s=2 * GIB), Network(bytes_per_s=1.0, ranks_per_node=1))
    assert time.exchange_s == 0.0
    assert time.read_s == pytest.approx(2.0)  # 4 GiB at 2 GiB/s, every rank a quarter
    assert time.total_s == pytest.approx(2.0)


def test_a_replicated_state_is_read_once_spread_over_the_ranks_and_the_rest_received() -> None:
    shares = group_shares(ReplicaGroup(count=1, ranks=4, shared_bytes=4 * GIB, own_bytes=0.0))
    assert shares.read == [GIB] * 4 and shares.received == [3 * GIB] * 4 and shares.sent == [3 * GIB] * 4
    shape = shape_checkpoint(_replicated(4))
    one_per_node = restore_time(shape, ReadSource(bytes_per_s=8 * GIB), Network(bytes_per_s=GIB, ranks_per_node=1))
    assert one_per_node.read_s == pytest.approx(0.5)  # 4 GiB once, not 16
    assert one_per_node.exchange_s == pytest.approx(3.0)  # each rank receives 3 GiB at 1 GiB/s: it gates
    assert one_per_node.total_s == pytest.approx(3.0)
    # Four ranks on one node share its NIC.
    shared_nic = restore_time(shape, ReadSource(bytes_per_s=8 * GIB), Network(bytes_per_s=GIB, ranks_per_node=4))
    assert shared_nic.exchange_s == pytest.approx(12.0)


def test_zero1_splits_the_weights_and_each_rank_reads_its_optimizer_shard() -> None:
    shape = shape_checkpoint(_replicated(2, zero=1, optimizer="adam-fp32"))
    shares = group_shares(shape.groups[0])
    assert shares.read == [6 * GIB, 6 * GIB]  # half the weights + its own 4 GiB shard
    assert shares.received == [2 * GIB, 2 * GIB]
    storage = StoreLimits(write_bytes_per_s=GIB, read_bytes_per_s=4 * GIB)
    durable = durable_restore(shape, storage, Network(bytes_per_s=100 * GIB))
    assert durable is not None and durable.total_s == pytest.approx(3.0)  # 12 GiB at 4 GiB/s


def test_the_rank_that_reads_the_most_gates_once_each_reader_is_capped() -> None:
    # 16 MiB chunks over 3 ranks: 5 chunks go 2, 2, 1, so two ranks read 32 MiB and one 16 MiB.
    shape = shape_checkpoint(CheckpointSpec(params=80 * MIB / 4, weights_dtype="fp32", optimizer="none",
                                            parallelism=Parallelism(dp=3)))
    assert group_shares(shape.groups[0]).read == [32 * MIB, 32 * MIB, 16 * MIB]
    network = Network(bytes_per_s=1e15)
    # Uncapped, the store moves the 80 MiB at its full 48 MiB/s however they are spread.
    assert restore_time(shape, ReadSource(bytes_per_s=48 * MIB), network).read_s == pytest.approx(80 / 48)
    # Each client at 16 MiB/s: the two ranks with 32 MiB take 2 s.
    capped = ReadSource(bytes_per_s=48 * MIB, per_reader_bytes_per_s=16 * MIB)
    assert restore_time(shape, capped, network).read_s == pytest.approx(2.0)
    # The durable level takes the per-writer figure as each rank's cap.
    storage = StoreLimits(write_bytes_per_s=GIB, read_bytes_per_s=48 * MIB, per_writer_bytes_per_s=16 * MIB)
    durable = durable_restore(shape, storage, network)
    assert durable is not None and durable.read_s == pytest.approx(2.0)


def test_metadata_bounds_a_restore_of_many_objects() -> None:
    shape = uniform_shape(ranks=8, bytes_per_rank=GIB)  # 8 × (1 file + index) + 3 objects
    storage = StoreLimits(write_bytes_per_s=GIB, read_bytes_per_s=100 * GIB, metadata_ops_per_s=1.0)
    durable = durable_restore(shape, storage, Network())
    assert durable is not None and durable.total_s == pytest.approx(19.0)
    assert durable_restore(shape, StoreLimits(write_bytes_per_s=GIB), Network()) is None


def test_the_local_level_reads_shared_bytes_only_where_a_copy_is() -> None:
    shape = shape_checkpoint(_replicated(4))
    # No partner copy: the writer alone holds the weights, reads all 4 GiB and sends them to three ranks.
    alone = LocalLevel(bytes_per_s=4 * GIB, replicas=0, ranks_per_node=1, network_bytes_per_s=GIB).restore_local(shape)
    assert alone.node_read_bytes == 4 * GIB and alone.node_exchange_bytes == 12 * GIB
    assert alone.total_s == pytest.approx(12.0)
    # One partner copy on the next replica's node: the two holders read half each.
    paired = LocalLevel(bytes_per_s=4 * GIB, replicas=1, ranks_per_node=1, network_bytes_per_s=GIB)
    local = paired.restore_local(shape)
    assert local.node_read_bytes == 2 * GIB and local.node_exchange_bytes == 6 * GIB
    # A lost node: its bytes (4 GiB) come from its one partner, besides the partner's own restore.
    assert paired.restore_partner_s(shape) == pytest.approx(max(local.total_s, (2 + 4) / 4, (6 + 4) / 1))


def test_a_group_beyond_the_modelled_size_is_priced_close_to_the_exact_assignment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shape = shape_checkpoint(_replicated(64, gib=8.0))
    network, source = Network(bytes_per_s=GIB, ranks_per_node=1), ReadSource(bytes_per_s=64 * GIB)
    exact = restore_time(shape, source, network)
    monkeypatch.setattr(model, "MAX_GROUP_RANKS", 16)
    scaled = restore_time(shape, source, network)
    assert scaled.read_s == pytest.approx(exact.read_s, rel=0.05)
    assert scaled.exchange_s == pytest.approx(exact.exchange_s, rel=0.05)
    assert scaled.exchange_s == pytest.approx(8.0 * 63 / 64, rel=0.05)  # each rank receives 63/64 of 8 GiB
    # Read only where a copy is (the local level's two holders), the holders' sends grow with the group.
    monkeypatch.setattr(model, "MAX_GROUP_RANKS", 1 << 20)
    holders = ReadSource(bytes_per_s=64 * GIB, per_node=True, readers=2)
    exact = restore_time(shape, holders, network)
    monkeypatch.setattr(model, "MAX_GROUP_RANKS", 16)
    scaled = restore_time(shape, holders, network)
    assert scaled.node_read_bytes == pytest.approx(exact.node_read_bytes, rel=0.05) == 4 * GIB
    assert scaled.exchange_s == pytest.approx(exact.exchange_s, rel=0.05) == 4.0 * 63
