"""The planner's metadata model of a save and its commit: the engine's operation count, timed per probed kind."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from ckptio.errors import ConfigError
from ckptio.format.commit_ops import CommitShape, commit_ops
from ckptio.plan.admit import admit
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.commit_metadata import commit_metadata, commit_shape
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import shape_checkpoint, uniform_shape
from ckptio.plan.job.presets import PRESETS
from ckptio.storage.posix.posix_storage import PosixStorage

GB = 1e9
KINDS = ("create", "stat", "rename", "list", "fsync", "unlink")
EXT4 = {"create": 2914.0, "stat": 26968.0, "rename": 22435.0, "list": 9368.0, "fsync": 2402.0, "unlink": 3859.0}
"""Rates the probe measured on a local ext4 disk (docs/planning.md)."""


def test_the_counts_are_the_engines_for_the_jobs_shape() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=1 << 30, file_size_bytes=256 << 20)
    cs = commit_shape(shape, keep_last=2)
    assert (cs.world_size, cs.files_per_rank, cs.keep_last, cs.level) == (4, 4, 2, "durable")
    m = commit_metadata(cs, StoreLimits(write_bytes_per_s=GB))
    assert m.ops == commit_ops(CommitShape(world_size=4, files_per_rank=4, keep_last=2))


def test_files_per_rank_is_the_mean_rounded_up_so_the_total_is_never_short() -> None:
    shape = shape_checkpoint(PRESETS["mlperf-llama3-405b"].spec())
    files = sum(c.count * c.files for c in shape.classes)
    cs = commit_shape(shape, keep_last=3)
    assert files <= cs.world_size * cs.files_per_rank < files + cs.world_size


@pytest.mark.parametrize(("kind", "fsync", "ops_per_put"), [("posix", True, 7), ("posix", False, 5),
                                                              ("object", True, 1)])
def test_seconds_are_each_kinds_operations_over_its_rate(kind: str, fsync: bool, ops_per_put: int) -> None:
    # Every kind at the same rate: each storage operation costs its metadata operations ÷ the rate; a POSIX put
    # is seven of them with fsync (two stats, create, fsync, publish, directory fsync, temp removal), five without.
    rate = 100.0
    store = StoreLimits(write_bytes_per_s=GB, kind=kind, metadata_rates=dict.fromkeys(KINDS, rate))  # type: ignore[arg-type]
    shape = CommitShape(world_size=3, files_per_rank=2, keep_last=1)
    m = commit_metadata(shape, store, fsync=fsync)
    ops = commit_ops(shape)

    def weighted(part: dict[str, int]) -> int:
        return sum(n * (ops_per_put if op == "put" else 1) for op, n in part.items())

    assert m.save_s == pytest.approx(weighted(ops.per_save) / rate)
    assert m.commit_s == pytest.approx(weighted(ops.per_commit) / rate)
    assert m.rates_source == "probed" and m.measured


def test_a_slow_kind_costs_only_its_own_operations() -> None:
    fast = dict.fromkeys(KINDS, 1e6)
    shape = CommitShape(world_size=8, files_per_rank=1, keep_last=3)
    base = commit_metadata(shape, StoreLimits(write_bytes_per_s=GB, metadata_rates=fast))
    slow_unlink = commit_metadata(shape, StoreLimits(write_bytes_per_s=GB, metadata_rates={**fast, "unlink": 1.0}))
    puts, deletes = commit_ops(shape).total["put"], commit_ops(shape).total["delete"]
    # Each put removes its temp name, each delete is an unlink: one second each at 1 unlink/s.
    assert slow_unlink.total_s - base.total_s == pytest.approx((puts + deletes) * (1.0 - 1e-6), rel=1e-6)


def test_rates_come_from_the_probe_then_the_given_rate_then_the_defaults() -> None:
    shape = CommitShape(world_size=2, files_per_rank=1, keep_last=1)
    probed = commit_metadata(shape, StoreLimits(write_bytes_per_s=GB, metadata_ops_per_s=10.0,
                                                metadata_rates={"create": 5.0}))
    assert probed.rates["create"] == 5.0 and probed.rates["stat"] == 10.0
    assert probed.rates_source == "given"  # the least measured source used
    given = commit_metadata(shape, StoreLimits(write_bytes_per_s=GB, metadata_ops_per_s=10.0))
    assert set(given.rates.values()) == {10.0} and given.measured
    default = commit_metadata(shape, StoreLimits(write_bytes_per_s=GB))
    assert default.rates_source == "default" and not default.measured and default.total_s > 0
    s3 = commit_metadata(shape, StoreLimits(write_bytes_per_s=GB, kind="object", prefixes=2))
    assert s3.rates == {"create": 7000.0, "stat": 11000.0, "list": 11000.0, "unlink": 7000.0}


def test_a_non_positive_kind_rate_is_refused() -> None:
    with pytest.raises(ConfigError, match="metadata rate of create"):
        StoreLimits(write_bytes_per_s=GB, metadata_rates={"create": 0.0})


def test_metadata_slower_than_the_interval_fails_the_plan_and_the_gate() -> None:
    shape = uniform_shape(ranks=2, bytes_per_rank=64 << 20)
    schedule = Schedule(interval_s=60)
    slow = plan_burst(shape, StoreLimits(write_bytes_per_s=GB, metadata_rates=dict.fromkeys(KINDS, 1.0)), schedule)
    assert slow.keeps_up  # the bytes keep up: only the metadata refuses it
    assert slow.verdict == "fail" and "metadata" in slow.reason_codes
    assert slow.commit_metadata_s > 60
    decision = admit(slow)
    assert not decision.admitted and any("metadata" in r for r in decision.reasons)
    ext4 = plan_burst(shape, StoreLimits(write_bytes_per_s=GB, metadata_rates=EXT4), schedule)
    assert ext4.verdict == "ok" and ext4.commit_metadata_s < 1
    assert admit(ext4).admitted


def test_on_the_default_rates_metadata_warns_and_refuses_nothing() -> None:
    shape = uniform_shape(ranks=64, bytes_per_rank=64 << 20)
    budget = plan_burst(shape, StoreLimits(write_bytes_per_s=100 * GB), Schedule(interval_s=0.01))
    assert budget.commit_metadata_s > 0.01 and budget.commit_metadata["rates_source"] == "default"
    assert "metadata-unmeasured" in budget.reason_codes and "metadata" not in budget.reason_codes
    assert not any("metadata" in r for r in admit(budget).reasons)


def test_retention_counts_in_every_commit() -> None:
    shape = uniform_shape(ranks=4, bytes_per_rank=64 << 20)
    store = StoreLimits(write_bytes_per_s=GB, metadata_rates=EXT4)
    kept_all = plan_burst(shape, store, Schedule(interval_s=60), keep_last=0)
    kept_three = plan_burst(shape, store, Schedule(interval_s=60), keep_last=3)
    assert kept_all.metadata_ops["per_commit"]["delete"] == 1  # the commit lock alone: nothing is retired
    assert kept_three.metadata_ops["per_commit"]["delete"] > kept_all.metadata_ops["per_commit"]["delete"]
    assert kept_three.commit_metadata_s > kept_all.commit_metadata_s


def test_the_posix_put_table_is_what_posix_storage_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The table's fsyncs and publishes, held against a real PosixStorage.put: two fsyncs and one rename each, none
    # of the fsyncs when fsync is off (the directory is made first so only the put's own work is counted).
    counts: Counter[str] = Counter()
    for name, kind in (("fsync", "fsync"), ("replace", "rename"), ("link", "rename")):
        real = getattr(os, name)

        def counted(*args: object, _real: object = real, _kind: str = kind, **kwargs: object) -> object:
            counts[_kind] += 1
            return _real(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(os, name, counted)
    for fsync, mode in ((True, "overwrite"), (False, "overwrite"), (True, "create")):
        storage = PosixStorage(tmp_path / f"{fsync}-{mode}", fsync=fsync)
        storage.put("step/warm", b"x")
        counts.clear()
        storage.put("step/data", b"payload", mode=mode)  # type: ignore[arg-type]
        assert counts["rename"] == 1
        assert counts["fsync"] == (2 if fsync else 0)
