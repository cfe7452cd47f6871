"""The background-cost model: what each save mode costs the step, and how that moves with cores and the store.

Pure arithmetic on figures given here (no timing is measured or asserted; the kernel's write-back threshold is read
from files written here): the model's directions must hold for
every mode, and its special cases must say what the module docstring says.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.costs.background import MODES, ModeCost, cfs_weight, predict_modes, writer_rate
from ckptio.plan.costs.calibration import excess_from_trial
from ckptio.plan.costs.inputs import GIB, Host, StoreTiming, Workload, WriterCosts
from ckptio.plan.measure.memory import dirty_background_bytes

COSTS = WriterCosts()
_STORE_FIELDS = {"store_s", "direct_io", "writeback_store_s", "paced_store_s", "dirty_background_bytes"}


def _modes(*, host: Host | None = None, costs: WriterCosts | None = None, **figures: object) -> dict[str, ModeCost]:
    """:func:`predict_modes` with each figure put in the value it belongs to (:class:`Workload` or
    :class:`StoreTiming`), so that a test varies one figure by name."""
    store = StoreTiming(**{k: v for k, v in figures.items() if k in _STORE_FIELDS})  # type: ignore[arg-type]
    workload = Workload(**{k: v for k, v in figures.items() if k not in _STORE_FIELDS})  # type: ignore[arg-type]
    return predict_modes(workload, store, host=host, costs=costs)


def _lost(**kw: object) -> dict[str, float]:
    modes = _modes(bytes_per_rank=GIB, costs=COSTS, **kw)  # type: ignore[arg-type]
    return {name: cost.lost_per_save_s for name, cost in modes.items()}


@pytest.mark.parametrize("mode", MODES)
def test_more_cores_never_inflate_more_and_spare_cores_hide_the_writer(mode: str) -> None:
    cores = [0.5, 1.0, 1.25, 1.5, 2.0, 4.0]
    runs = [_modes(bytes_per_rank=GIB, store_s=2.0, host=Host(cores_per_rank=c, train_cores=1.0))[mode]
            for c in cores]
    lost = [r.lost_per_save_s for r in runs]
    assert lost == sorted(lost, reverse=True)
    if mode == "dcp_sync":  # training waits: cores do not enter
        assert len(set(lost)) == 1 and runs[0].step_inflation is None
        return
    inflation = [r.step_inflation for r in runs]
    assert inflation == sorted(inflation, reverse=True)  # type: ignore[type-var]
    # From 1 core to 1.5 cores per rank, some of the writer's CPU moves to the spare half core.
    assert runs[1].stolen_s > runs[3].stolen_s
    # A whole spare core takes the one-thread writer entirely: training loses only the blocking part.
    assert runs[-1].stolen_s == 0.0 and runs[-1].step_inflation == 1.0
    assert runs[-1].lost_per_save_s == pytest.approx(runs[-1].blocking_s)


def test_dcp_best_pays_per_state_item_and_only_it() -> None:
    """``items_per_rank``: DCP-best's checkpointer pipes and plans every entry of the state, so the same bytes in
    more entries cost it more CPU and more time lost; the other modes are charged per byte only. A bad count is a
    named error."""
    host = Host(cores_per_rank=1.0, train_cores=1.0)
    runs = [_modes(bytes_per_rank=GIB, store_s=1.0, host=host, costs=COSTS, items_per_rank=n)
            for n in (0, 100, 1000)]
    best = [r["dcp_best"] for r in runs]
    assert best[1].background_cpu_s - best[0].background_cpu_s == pytest.approx(100 / COSTS.dcp_items_per_s)
    assert best[0].lost_per_save_s < best[1].lost_per_save_s < best[2].lost_per_save_s
    for mode in ("dcp_sync", "dcp_async", "ckptio"):
        assert runs[0][mode] == runs[2][mode]
    for bad in (-1, 1.5):
        with pytest.raises(ConfigError, match="items_per_rank"):
            Workload(bytes_per_rank=GIB, items_per_rank=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_a_faster_store_never_loses_more(mode: str) -> None:
    host = Host(cores_per_rank=1.0, train_cores=1.0)
    # A flush longer than the interval makes the next save wait for the one slot (async modes).
    lost = [_lost(store_s=s, host=host, interval_s=10.0)[mode] for s in (40.0, 20.0, 10.0, 5.0, 1.0)]
    assert lost == sorted(lost, reverse=True)
    assert lost[0] > lost[-1]


def test_with_no_spare_core_every_background_byte_is_paid_by_training() -> None:
    host = Host(cores_per_rank=1.0, train_cores=1.0)
    modes = _modes(bytes_per_rank=GIB, store_s=0.0, host=host, costs=COSTS)
    for name in ("dcp_async", "dcp_best", "ckptio"):
        assert modes[name].stolen_s == pytest.approx(modes[name].background_cpu_s)
    # Priority only spreads it: ckptio's niced writer inflates each step less, over a longer flush.
    assert modes["ckptio"].step_inflation < modes["dcp_best"].step_inflation  # type: ignore[operator]
    assert modes["ckptio"].flush_s > modes["ckptio"].background_cpu_s


def test_a_niced_writer_takes_idle_time_first() -> None:
    host = Host(cores_per_rank=1.2, train_cores=1.0)  # a fifth of a core idle
    niced_rate, niced_from_training = writer_rate(host, 10)
    equal_rate, equal_from_training = writer_rate(host, 0)
    assert niced_from_training / niced_rate < equal_from_training / equal_rate
    assert cfs_weight(0) == 1024.0 and cfs_weight(10) < cfs_weight(0) / 9


def test_per_mode_work_follows_the_costs() -> None:
    costs = WriterCosts(copy_bytes_per_s=1e9, fresh_copy_bytes_per_s=0.5e9, checksum_bytes_per_s=2e9,
                        page_cache_bytes_per_s=2e9, torch_save_bytes_per_s=0.25e9, direct_write_bytes_per_s=4e9)
    modes = _modes(bytes_per_rank=1e9, store_s=0.5, costs=costs, host=Host(cores_per_rank=1.0),
                          direct_io=False)
    assert modes["dcp_sync"].lost_per_save_s == pytest.approx(4.0)  # the write is slower than the store
    assert modes["dcp_async"].blocking_s == pytest.approx(2.0)  # fresh allocation + copy
    assert modes["dcp_best"].blocking_s == 0.0
    assert modes["dcp_best"].background_cpu_s == pytest.approx(1.0 + 4.0)  # staging thread + writer process
    assert modes["ckptio"].blocking_s == pytest.approx(1.0)
    assert modes["ckptio"].background_cpu_s == pytest.approx(0.5 + 0.5)  # crc32c + page cache
    direct = _modes(bytes_per_rank=1e9, store_s=0.5, costs=costs, host=Host(cores_per_rank=1.0))
    assert direct["ckptio"].background_cpu_s == pytest.approx(0.5 + 0.25)  # crc32c + O_DIRECT's bounce copy


def test_writing_around_the_page_cache_never_costs_the_step_more() -> None:
    host = Host(cores_per_rank=1.0, train_cores=1.0)
    for page_cache in (0.3e9, 1e9, 3e9):
        costs = WriterCosts(page_cache_bytes_per_s=page_cache, direct_write_bytes_per_s=5e9)
        direct, buffered = (_modes(bytes_per_rank=GIB, store_s=1.0, host=host, costs=costs,
                                          direct_io=d)["ckptio"] for d in (True, False))
        assert direct.lost_per_save_s < buffered.lost_per_save_s
        # DCP's writers go through the page cache whatever ckptio does.
        assert _modes(bytes_per_rank=GIB, store_s=1.0, host=host, costs=costs, direct_io=True)["dcp_best"] \
            == _modes(bytes_per_rank=GIB, store_s=1.0, host=host, costs=costs, direct_io=False)["dcp_best"]


def test_a_device_copy_is_dma() -> None:
    modes = _modes(bytes_per_rank=GIB, store_s=1.0, device_copy_s=0.3, host=Host(cores_per_rank=1.0))
    # Default async_save blocks for its copy; ckptio and DCP-best copy on a side stream (no overlap given here:
    # the optimizer step waits for all of it).
    assert modes["dcp_async"].blocking_s == 0.3 and modes["ckptio"].blocking_s == 0.0
    assert modes["ckptio"].staging_wait_s == modes["dcp_best"].staging_wait_s == 0.3
    assert modes["dcp_best"].background_cpu_s == pytest.approx(GIB / COSTS.torch_save_bytes_per_s)
    assert modes["dcp_sync"].lost_per_save_s == pytest.approx(0.3 + max(1.0, GIB / COSTS.torch_save_bytes_per_s))


def test_default_async_save_copies_a_dtensor_three_times_on_cpu_and_once_more_off_a_device() -> None:
    costs = WriterCosts(fresh_copy_bytes_per_s=1e9)
    host = Host(cores_per_rank=1.0)

    def blocking(share: float, device_copy_s: float | None = None) -> float:
        return _modes(bytes_per_rank=1e9, store_s=0.5, costs=costs, host=host, dtensor_share=share,
                             device_copy_s=device_copy_s)["dcp_async"].blocking_s

    assert blocking(0.0) == pytest.approx(1.0)  # a plain tensor: one fresh copy
    assert blocking(1.0) == pytest.approx(3.0)  # deepcopy (two copies), then the copy into it
    assert blocking(0.5) == pytest.approx(2.0)
    assert blocking(0.0, device_copy_s=0.2) == pytest.approx(0.2)  # the D2H lands in the new buffer
    assert blocking(1.0, device_copy_s=0.2) == pytest.approx(1.2)  # .to("cpu"), then a host copy
    # DCP-best copies into its cached buffers and ckptio into its slot, DTensor or not.
    for mode in ("dcp_best", "ckptio", "dcp_sync"):
        plain, sharded = (_modes(bytes_per_rank=1e9, store_s=0.5, costs=costs, host=host,
                                        dtensor_share=share)[mode] for share in (0.0, 1.0))
        assert plain == sharded
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="dtensor_share"):
            Workload(bytes_per_rank=1e9, dtensor_share=bad)


def test_a_file_below_the_writeback_threshold_moves_at_its_fsync() -> None:
    costs = WriterCosts(torch_save_bytes_per_s=1e9, checksum_bytes_per_s=1e12, direct_write_bytes_per_s=1e12)
    host = Host(cores_per_rank=1.0)

    def sync(dirty: float | None, direct_io: bool = True) -> dict[str, float]:
        modes = _modes(bytes_per_rank=1e9, store_s=0.5, costs=costs, host=host, dirty_background_bytes=dirty,
                              direct_io=direct_io)
        return {m: modes[m].lost_per_save_s if m == "dcp_sync" else modes[m].flush_s for m in modes}

    assert sync(None)["dcp_sync"] == pytest.approx(1.0)  # the store takes bytes as they come: the slower wins
    assert sync(2e9)["dcp_sync"] == pytest.approx(1.5)  # nothing moves before the fsync: write, then transfer
    assert sync(0.0)["dcp_sync"] == pytest.approx(1.0)  # write-back from the first byte
    assert sync(0.5e9)["dcp_sync"] == pytest.approx(1.25)  # half serial, half overlapped
    # Each mode's flush only grows as less of the write overlaps; ckptio's O_DIRECT chunks are always serial.
    for mode in MODES:
        flushes = [sync(d)[mode] for d in (0.0, 0.5e9, 2e9)]
        assert all(later >= earlier for earlier, later in itertools.pairwise(flushes)), mode
    assert sync(0.0)["ckptio"] > sync(None)["ckptio"]
    assert sync(0.0, direct_io=False)["ckptio"] == pytest.approx(sync(None, direct_io=False)["ckptio"])
    with pytest.raises(ConfigError, match="dirty_background_bytes"):
        StoreTiming(store_s=0.5, dirty_background_bytes=-1.0)


def test_the_writeback_threshold_is_read_from_the_kernel(tmp_path: Path) -> None:
    vm = tmp_path / "vm"
    vm.mkdir()
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000 kB\nMemAvailable: 4000 kB\n")
    (vm / "dirty_background_bytes").write_text("0\n")
    (vm / "dirty_background_ratio").write_text("10\n")
    assert dirty_background_bytes(str(vm), str(meminfo)) == pytest.approx(0.1 * 4000 * 1024)
    (vm / "dirty_background_bytes").write_text("1048576\n")
    assert dirty_background_bytes(str(vm), str(meminfo)) == 1048576.0
    assert dirty_background_bytes(str(tmp_path / "absent"), str(meminfo)) is None


@pytest.mark.parametrize(
    "bad",
    [{"cores_per_rank": 0}, {"train_cores": -1.0}, {"cores_per_rank": float("nan")}, {"writer_nice": 20},
     {"fresh_copy_drag": -0.1}, {"fresh_copy_drag": float("inf")}, {"fresh_copy_drag": "0.2"},
     {"direct_io_s_per_gib": -1.0}, {"direct_io_s_per_gib": float("nan")}],
)
def test_bad_host_figures_are_named_errors(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Host(**bad)  # type: ignore[arg-type]


def test_bad_costs_are_named_errors() -> None:
    with pytest.raises(ConfigError, match="torch_save_bytes_per_s"):
        WriterCosts(torch_save_bytes_per_s=0.0)
    with pytest.raises(ConfigError):
        Workload(bytes_per_rank=-1.0)
    with pytest.raises(ConfigError, match="store_s"):
        StoreTiming(store_s=float("nan"))


def test_costs_round_trip_through_json() -> None:
    costs = WriterCosts(copy_bytes_per_s=3e9)
    assert WriterCosts.from_json({**costs.to_json(), "unknown": 1.0}) == costs


@pytest.mark.parametrize("mode", MODES)
def test_a_busier_host_never_costs_less(mode: str) -> None:
    shares = [1.0, 0.5, 0.25]
    lost = [_modes(bytes_per_rank=GIB, store_s=0.1,
                          host=Host(cores_per_rank=1.0, cpu_share=s))[mode].lost_per_save_s for s in shares]
    assert all(later >= earlier * (1 - 1e-12) for earlier, later in itertools.pairwise(lost))


def test_host_load_slows_work_on_the_training_thread_not_a_dma() -> None:
    quiet = _modes(bytes_per_rank=GIB, store_s=0.0, host=Host(cores_per_rank=1.0))
    busy = _modes(bytes_per_rank=GIB, store_s=0.0, host=Host(cores_per_rank=1.0, cpu_share=0.25))
    assert busy["ckptio"].blocking_s == pytest.approx(4 * quiet["ckptio"].blocking_s)
    assert busy["dcp_sync"].lost_per_save_s == pytest.approx(4 * quiet["dcp_sync"].lost_per_save_s)
    # What the writer takes from training on its core stays its CPU time: training was already at its share.
    assert busy["dcp_best"].stolen_s == pytest.approx(quiet["dcp_best"].stolen_s)
    dma = _modes(bytes_per_rank=GIB, store_s=0.0, device_copy_s=0.2,
                        host=Host(cores_per_rank=1.0, cpu_share=0.25))
    assert dma["ckptio"].staging_wait_s == 0.2
    with pytest.raises(ConfigError):
        Host(cpu_share=0.0)


def test_prediction_error_is_within_the_bar_by_ratio_or_by_points() -> None:
    from ckptio.plan.costs.calibration import prediction_error

    assert prediction_error(1.1, 1.0, 100.0) == pytest.approx((1.1, 0.1, True))  # 10 % off
    ratio, points, within = prediction_error(0.2, 1.0, 10.0)  # 5x off, 8 points of a 10 s interval
    assert (ratio, within) == (pytest.approx(0.2), False) and points == pytest.approx(-8.0)
    assert prediction_error(0.2, 1.0, 100.0).within  # 5x off, but only 0.8 points of the time between saves
    assert prediction_error(0.1, 0.0, 10.0).ratio == float("inf")


def test_lockstep_ranks_wait_for_each_others_bursts_only_when_the_store_paces_the_writer() -> None:
    from ckptio.plan.costs.background import lockstep_delay

    # A writer busy 0.5 s of a 1 s flush robs its rank of 0.4 s: a second rank's bursts, independent of these,
    # add the part that does not coincide (1 - 0.5); many ranks tend to the theft rate over the whole flush.
    assert lockstep_delay(0.4, 0.5, 1.0, 1) == pytest.approx(0.4)
    assert lockstep_delay(0.4, 0.5, 1.0, 2) == pytest.approx(0.4 * 1.5)
    delays = [lockstep_delay(0.4, 0.5, 1.0, n) for n in (1, 2, 4, 8, 4096)]
    assert all(later > earlier for earlier, later in itertools.pairwise(delays))
    assert delays[-1] == pytest.approx(0.4 / 0.5)
    # A writer busy the whole flush (CPU-bound) robs every rank at once: its theft, whatever the ranks.
    assert lockstep_delay(0.4, 1.0, 1.0, 4096) == pytest.approx(0.4)


@pytest.mark.parametrize("mode", ["dcp_async", "dcp_best", "ckptio"])
def test_more_lockstep_ranks_never_cost_less_and_a_cpu_bound_flush_is_unchanged(mode: str) -> None:
    host = Host(cores_per_rank=1.0)
    paced = [_lost(store_s=20.0, host=host, lockstep_ranks=n)[mode] for n in (1, 2, 8, 1024)]
    assert all(later >= earlier for earlier, later in itertools.pairwise(paced))
    assert paced[-1] > paced[0]
    cpu_bound = [_lost(store_s=0.0, host=host, lockstep_ranks=n)[mode] for n in (1, 2, 1024)]
    assert cpu_bound == pytest.approx([cpu_bound[0]] * 3)
    assert _lost(store_s=20.0, host=host, lockstep_ranks=1)["dcp_sync"] == \
        _lost(store_s=20.0, host=host, lockstep_ranks=1024)["dcp_sync"]


def test_lockstep_ranks_lose_a_buffered_files_serialization_once() -> None:
    """Below the write-back threshold DCP's writers serialize from the save's start on every rank at once: their
    theft lines up and lockstep ranks lose it once, whatever their number. With write-back from the first byte the
    bursts do not line up and more ranks lose more; so do ckptio's ``O_DIRECT`` chunks, whatever the threshold."""
    host = Host(cores_per_rank=1.0)

    def lost(mode: str, ranks: int, dirty: float) -> float:
        return _lost(store_s=20.0, host=host, lockstep_ranks=ranks, dirty_background_bytes=dirty)[mode]

    for mode in ("dcp_async", "dcp_best"):
        below = [lost(mode, n, 2 * GIB) for n in (1, 2, 1024)]
        assert below == pytest.approx([below[0]] * 3), mode
        assert lost(mode, 1024, 0.0) > lost(mode, 1, 0.0), mode
    assert lost("ckptio", 1024, 2 * GIB) > lost("ckptio", 1, 2 * GIB)


@pytest.mark.parametrize("mode", ["dcp_async", "dcp_best", "ckptio"])
def test_a_cpu_job_waiting_for_its_peers_has_no_spare_below_one_core(mode: str) -> None:
    def lost(train_cores: float, **kw: object) -> float:
        host = Host(cores_per_rank=1.0, train_cores=train_cores)
        return _lost(store_s=0.5, host=host, **kw)[mode]  # type: ignore[arg-type]

    # Alone, a rank's idle fifth of a core hides part of the writer.
    assert lost(0.8) < lost(1.0)
    # In lockstep its idle is waiting for its peers' CPU work, which the writers slow too: no spare.
    assert lost(0.8, lockstep_ranks=2) == pytest.approx(lost(1.0, lockstep_ranks=2))
    # A GPU job's waits are for the device, which the writers do not slow: the idle stays spare.
    assert lost(0.8, lockstep_ranks=2, device_copy_s=0.1) < lost(1.0, lockstep_ranks=2, device_copy_s=0.1)
    # A whole spare core beyond training's stays spare in lockstep too.
    spare = _modes(bytes_per_rank=GIB, store_s=0.5, lockstep_ranks=2,
                          host=Host(cores_per_rank=2.0, train_cores=0.8))[mode]
    assert spare.stolen_s == 0.0


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_lockstep_ranks_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ConfigError, match="lockstep_ranks"):
        Workload(bytes_per_rank=GIB, lockstep_ranks=bad)  # type: ignore[arg-type]


def test_a_fresh_copy_kept_alive_drags_default_async_save_only_for_its_flush() -> None:
    """``fresh_copy_drag``: training's steps run that much slower while default ``async_save``'s fresh staging copy
    is alive, which is its flush; no other mode keeps fresh memory alive, and a drag of 0 changes nothing."""
    def modes(drag: float, store_s: float = 2.0) -> dict[str, object]:
        return _modes(bytes_per_rank=GIB, store_s=store_s, costs=COSTS,
                             host=Host(cores_per_rank=2.0, fresh_copy_drag=drag))

    base, dragged, more = modes(0.0), modes(0.2), modes(0.4)
    for mode in ("dcp_sync", "dcp_best", "ckptio"):
        assert dragged[mode] == base[mode] == more[mode]
    a, b, c = base["dcp_async"], dragged["dcp_async"], more["dcp_async"]
    assert b.flush_s == a.flush_s and b.blocking_s == a.blocking_s
    assert b.lost_per_save_s == pytest.approx(a.lost_per_save_s + 0.2 * a.flush_s)
    assert a.lost_per_save_s < b.lost_per_save_s < c.lost_per_save_s
    assert a.step_inflation < b.step_inflation < c.step_inflation
    # A slower store keeps the copy alive longer: the drag costs more.
    slow = modes(0.2, store_s=8.0)["dcp_async"]
    assert slow.lost_per_save_s - modes(0.0, store_s=8.0)["dcp_async"].lost_per_save_s > 0.2 * a.flush_s


def test_device_io_collateral_charges_every_background_writer_on_a_durable_posix_tier() -> None:
    """``direct_io_s_per_gib``: the store's device I/O costs the job that much per GiB beyond the writers' CPU,
    whoever moves the bytes while training runs: ckptio and both background DCP modes pay it, ``dcp.save`` (its
    I/O lands while training waits) and every mode off a durable POSIX tier (``direct_io`` False) do not, and twice
    the bytes cost twice the collateral."""
    def modes(rate: float, *, direct_io: bool = True, nbytes: float = GIB) -> dict[str, object]:
        return _modes(bytes_per_rank=nbytes, store_s=2.0, costs=COSTS, direct_io=direct_io,
                             host=Host(cores_per_rank=2.0, direct_io_s_per_gib=rate))

    base, charged = modes(0.0), modes(0.5)
    assert charged["dcp_sync"] == base["dcp_sync"]
    assert modes(0.5, direct_io=False) == modes(0.0, direct_io=False)
    for mode in ("dcp_async", "dcp_best", "ckptio"):
        a, b = base[mode], charged[mode]
        assert b.flush_s == a.flush_s and b.blocking_s == a.blocking_s, mode
        assert b.lost_per_save_s == pytest.approx(a.lost_per_save_s + 0.5), mode
        assert b.step_inflation > a.step_inflation, mode
    double = modes(0.5, nbytes=2 * GIB)["ckptio"].lost_per_save_s - modes(0.0, nbytes=2 * GIB)["ckptio"].lost_per_save_s
    assert double == pytest.approx(1.0)


def test_buffered_writers_wait_for_the_write_back_and_ckptio_direct_io_for_the_store() -> None:
    """``writeback_store_s``: a buffered writer's bytes reach this host's disk by the kernel's write-back (DCP's
    three modes, ckptio's buffered path); ckptio's ``O_DIRECT`` writes take ``store_s``. None means ``store_s``."""
    def modes(**kw: object) -> dict[str, object]:
        return _modes(bytes_per_rank=GIB, store_s=4.0, costs=COSTS, dirty_background_bytes=2 * GIB,
                             host=Host(cores_per_rank=2.0), **kw)  # type: ignore[arg-type]

    plain, same, faster = modes(), modes(writeback_store_s=4.0), modes(writeback_store_s=1.0)
    assert plain == same
    assert faster["dcp_sync"].lost_per_save_s < plain["dcp_sync"].lost_per_save_s  # training waits for the fsync
    for mode in ("dcp_async", "dcp_best"):
        assert faster[mode].flush_s < plain[mode].flush_s
        assert faster[mode].lost_per_save_s <= plain[mode].lost_per_save_s
    assert faster["ckptio"] == plain["ckptio"]
    buffered = modes(writeback_store_s=1.0, direct_io=False)["ckptio"]
    assert buffered.flush_s < modes(direct_io=False)["ckptio"].flush_s
    with pytest.raises(ConfigError):
        modes(writeback_store_s=-1.0)
    with pytest.raises(ConfigError):
        modes(writeback_store_s=float("nan"))


def test_a_paced_store_holds_each_writer_for_its_booking_and_a_slower_disk_under_it_binds() -> None:
    """``paced_store_s``: the demo's and bench_planner's budget on this host's disk books a writer's bytes and holds
    it until the booking is up, so each writer takes the longer of the booking and its real write (for a file
    below the write-back threshold: serialize, then the fsync's write-back)."""
    costs = WriterCosts(torch_save_bytes_per_s=2e9, checksum_bytes_per_s=1e12, direct_write_bytes_per_s=1e12)

    def modes(**kw: object) -> dict[str, object]:
        return _modes(bytes_per_rank=1e9, store_s=0.25, writeback_store_s=0.25, costs=costs,
                             host=Host(cores_per_rank=2.0), dirty_background_bytes=2e9,
                             **kw)  # type: ignore[arg-type]

    real = modes()["dcp_sync"].lost_per_save_s
    assert real == pytest.approx(0.5 + 0.25)  # serialize, then the write-back
    assert modes(paced_store_s=2.0)["dcp_sync"].lost_per_save_s == pytest.approx(2.0)  # the booking binds
    assert modes(paced_store_s=0.5)["dcp_sync"].lost_per_save_s == pytest.approx(real)  # the disk binds
    assert modes(paced_store_s=0.0) == modes()
    for mode in ("dcp_async", "dcp_best", "ckptio"):  # each background writer's flush, too
        assert modes(paced_store_s=2.0)[mode].flush_s >= 2.0, mode  # type: ignore[attr-defined]
    for bad in (-1.0, float("nan")):
        with pytest.raises(ConfigError):
            modes(paced_store_s=bad)


def test_a_trial_save_sets_the_direct_io_term_to_what_the_model_does_not_charge() -> None:
    """:func:`excess_from_trial`: the trial's loss beyond the model's blocking copy and CPU theft, per GiB of
    the rank's bytes; never below 0; a wait for the previous save (which a trial never has) is not subtracted;
    and the prediction built with it charges a same-size save exactly the trial's loss."""
    kwargs = {"bytes_per_rank": GIB / 2, "store_s": 2.0, "costs": COSTS, "direct_io": True}
    modelled = _modes(host=Host(cores_per_rank=1.0), **kwargs)["ckptio"]
    charged = modelled.blocking_s + modelled.stolen_s
    assert excess_from_trial(charged + 0.25, modelled, GIB / 2) == pytest.approx(0.5)
    assert excess_from_trial(charged / 2, modelled, GIB / 2) == 0.0
    term = excess_from_trial(charged + 0.25, modelled, GIB / 2)
    again = _modes(host=Host(cores_per_rank=1.0, direct_io_s_per_gib=term), **kwargs)["ckptio"]
    assert again.lost_per_save_s == pytest.approx(charged + 0.25)
    waiting = _modes(host=Host(cores_per_rank=1.0), interval_s=0.5, **kwargs)["ckptio"]
    assert waiting.lost_per_save_s > charged  # the flush outlasts the interval: the next save waits
    assert excess_from_trial(charged + 0.25, waiting, GIB / 2) == pytest.approx(0.5)
    for trial, nbytes in ((float("nan"), GIB), (0.1, 0.0)):
        with pytest.raises(ConfigError):
            excess_from_trial(trial, modelled, nbytes)


def test_a_buffered_trial_charges_dcps_background_modes_instead_of_the_direct_io_term() -> None:
    """``Host.buffered_io_s_per_gib``, from a trial of DCP-best's writer: DCP-best's prediction is then the
    trial's loss, default ``async_save`` takes the same per-GiB excess on top of its own model, ``dcp.save`` (its
    I/O lands while training waits) and ckptio (``direct_io_s_per_gib``, its own trial) keep theirs; None keeps the
    direct term for DCP's modes as before; a negative or non-finite figure is refused."""
    kwargs = {"bytes_per_rank": GIB / 2, "store_s": 2.0, "costs": COSTS, "direct_io": True}

    def modes(**host: float | None) -> dict[str, ModeCost]:
        return _modes(host=Host(cores_per_rank=1.0, **host), **kwargs)  # type: ignore[arg-type]

    bare = modes(buffered_io_s_per_gib=0.0)
    trial = bare["dcp_best"].lost_per_save_s + 0.3
    term = excess_from_trial(trial, bare["dcp_best"], GIB / 2)
    assert term == pytest.approx(0.6)
    charged = modes(buffered_io_s_per_gib=term, direct_io_s_per_gib=0.2)
    assert charged["dcp_best"].lost_per_save_s == pytest.approx(trial)
    assert charged["dcp_async"].lost_per_save_s == pytest.approx(bare["dcp_async"].lost_per_save_s + 0.3)
    assert charged["dcp_sync"].lost_per_save_s == pytest.approx(bare["dcp_sync"].lost_per_save_s)
    assert charged["ckptio"].lost_per_save_s == pytest.approx(bare["ckptio"].lost_per_save_s + 0.1)
    direct_only = modes(direct_io_s_per_gib=0.2)  # no buffered trial: DCP's modes take the direct term
    assert direct_only["dcp_best"].lost_per_save_s == pytest.approx(bare["dcp_best"].lost_per_save_s + 0.1)
    for bad in (-0.1, float("inf")):
        with pytest.raises(ConfigError):
            Host(buffered_io_s_per_gib=bad)
