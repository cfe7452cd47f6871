"""Host-side serialize rate: forked writers measured together, none left behind, a silent child is killed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from ckptio.plan.measure.host import _collect, _reap, serialize_bytes_per_s

MIB = 1 << 20


def _children() -> set[int]:
    # Listed, never waited for: other tests of the session may have children of their own.
    return {child.pid for child in psutil.Process().children()}


@pytest.mark.parametrize("writers", [1, 2])
def test_serialize_rate_is_measured_and_children_are_reaped(writers: int) -> None:
    before = _children()
    rate = serialize_bytes_per_s(4 * MIB, writers=writers)
    assert rate > 0
    assert _children() <= before


def test_a_child_that_never_answers_is_killed() -> None:
    before = _children()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child that hangs instead of reporting
        try:
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        assert _collect([read_fd], time.monotonic() + 0.2) == []
    finally:
        _reap([pid])
        os.close(read_fd)
        os.close(write_fd)
    assert pid not in _children()
    assert _children() <= before


def test_fresh_copy_drag_brackets_live_steps_with_clean_ones_and_leaves_the_state_alone() -> None:
    """The drag measurement runs clean, live and clean steps around a fresh copy of every tensor (a DTensor's
    local shard) and never writes the state. Its value is a timing: only its range is asserted."""
    import torch

    from ckptio.errors import ConfigError
    from ckptio.plan.measure.host import measure_fresh_copy_drag

    state = {"w": torch.arange(1 << 16, dtype=torch.float32), "nested": {"m": [torch.ones(4)], "step": 3}}
    before = {"w": state["w"].clone(), "m": state["nested"]["m"][0].clone()}
    calls = []

    def step() -> None:
        calls.append(1)
        buffers = [torch.empty(1 << 18).fill_(1.0) for _ in range(4)]  # a CPU step's host buffers
        del buffers

    drag = measure_fresh_copy_drag(step, lambda: state, steps=2, repeats=2)
    assert drag >= 0.0 and len(calls) == 12  # 2 × (2 clean + 2 live + 2 clean)
    calls.clear()
    measure_fresh_copy_drag(step, lambda: state, steps=2, repeats=2, steady_heap=True)
    assert len(calls) == 14  # a never-trimmed heap: 2 untimed steps with a first copy come first
    assert torch.equal(state["w"], before["w"]) and torch.equal(state["nested"]["m"][0], before["m"])
    with pytest.raises(ConfigError):
        measure_fresh_copy_drag(step, lambda: state, steps=0)
    with pytest.raises(ConfigError):
        measure_fresh_copy_drag(step, lambda: state, repeats=0)


def test_save_loss_brackets_each_save_and_steps_while_any_rank_saves() -> None:
    """A trial save's loss: clean steps, the save, steps while it (or a peer's: ``any_writing`` answering yes a
    few more times) is in flight, clean steps shared with the next round; saves numbered from 1. Its value is a
    timing: only that it is finite is asserted."""
    import math

    from ckptio.errors import ConfigError
    from ckptio.plan.measure.host import measure_save_loss

    steps: list[int] = []
    saves: list[int] = []
    peer_saving = [0]

    def step() -> None:
        steps.append(len(saves))
        time.sleep(0.001)

    def save(index: int) -> object:
        saves.append(index)
        polls = [2]  # in flight for two steps

        def done() -> bool:
            polls[0] -= 1
            return polls[0] < 0

        return done

    def any_writing(writing: bool) -> bool:
        peer_saving[0] -= 1
        return writing or peer_saving[0] >= 0

    peer_saving[0] = 1  # the first agreement (the ranks line up) eats one; the peer then saves one step longer
    lost = measure_save_loss(step, save, steps=2, repeats=2, any_writing=any_writing)  # type: ignore[arg-type]
    assert math.isfinite(lost)
    assert saves == [1, 2]
    assert steps.count(0) == 2 and steps.count(1) >= 2 + 2 and steps.count(2) == 2 + 2
    for bad in ({"steps": 0}, {"repeats": 0}):
        with pytest.raises(ConfigError):
            measure_save_loss(step, save, **bad)  # type: ignore[arg-type]


def test_save_loss_at_the_jobs_interval_takes_every_steps_per_round() -> None:
    """Given the job's interval, each round is as long as the job's: the clean run after a save fills the round up
    to ``every`` steps (here 7 − 2 in flight = 5), and never runs fewer than ``steps`` (a flight longer than the
    interval)."""
    from ckptio.errors import ConfigError
    from ckptio.plan.measure.host import measure_save_loss

    def run(every: int, flight: int) -> list[int]:
        steps: list[int] = []
        saves: list[int] = []

        def save(index: int) -> object:
            saves.append(index)
            polls = [flight]
            def done() -> bool:
                polls[0] -= 1
                return polls[0] < 0
            return done

        measure_save_loss(lambda: steps.append(len(saves)), save, steps=3, repeats=2,  # type: ignore[arg-type]
                          every=every)
        return [steps.count(n) for n in range(3)]

    assert run(every=7, flight=2) == [3, 7, 7]
    assert run(every=4, flight=2) == [3, 2 + 3, 2 + 3]
    with pytest.raises(ConfigError):
        measure_save_loss(lambda: None, lambda index: (lambda: True), every=0)  # type: ignore[arg-type]


def test_a_trial_save_that_fails_is_raised_after_every_round_has_stepped() -> None:
    """A save that raises on one rank (a full disk) must not leave its peers in the collective: the rank goes on
    through every round, agreeing at each step as they do, and raises the save's own error at the end."""
    from ckptio.errors import StorageError
    from ckptio.plan.measure.host import measure_save_loss

    saves: list[int] = []
    agreements: list[bool] = []

    def save(index: int) -> object:
        saves.append(index)
        if index == 2:
            raise StorageError("no space left on device")
        return lambda: True

    def any_writing(writing: bool) -> bool:
        agreements.append(writing)
        return writing

    with pytest.raises(StorageError, match="no space"):
        measure_save_loss(lambda: None, save, steps=1, repeats=3, any_writing=any_writing)  # type: ignore[arg-type]
    assert saves == [1, 2, 3]
    assert agreements == [False, False] * 3  # per round: line up, then "nothing in flight"


def test_save_loss_of_a_real_checkpointer_commits_every_trial_save(tmp_path: Path) -> None:
    """Through ckptio's own writer, as the planner's harnesses call it: every trial save is committed by the time
    the measurement returns (it steps until each is durable)."""
    import math

    import torch

    from ckptio import Checkpointer
    from ckptio.plan.measure.host import measure_save_loss

    state = {"w": torch.randn(1 << 18)}
    with Checkpointer(root=str(tmp_path), max_pending=1) as checkpointer:
        checkpointer.save(0, state).wait()

        def save(index: int) -> object:
            return checkpointer.save(index, state).done

        def step() -> None:
            checkpointer.wait_staged()
            state["w"].mul_(1.0)

        lost = measure_save_loss(step, save, steps=1, repeats=3)  # type: ignore[arg-type]
        assert math.isfinite(lost)
        assert checkpointer.latest_step() == 3


def test_the_disk_probe_writes_both_ways_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Both rates are real writes into the directory, which holds nothing afterwards (a probe's file left behind
    would be read as part of the store). The rates are timings: only their sign is asserted."""
    from ckptio.plan.measure.disk import measure_disk

    (tmp_path / "kept").write_bytes(b"x")
    rates = measure_disk(str(tmp_path), direct_bytes=1 << 20, writeback_bytes=1 << 20)
    assert rates.direct_bytes_per_s > 0 and rates.writeback_bytes_per_s > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_the_cost_probe_spends_freed_page_cache_until_it_turns_cold_and_leaves_nothing(tmp_path: Path) -> None:
    """Spending the pool of freed page-cache pages stops after two chunks that write slower than the cold bar (a
    bar no write meets: two chunks), at the cap (a bar every write meets), or at a full disk; the whole probe
    removes what it wrote. Which chunks a VM hands out warm is the host's: only the stopping rules are asserted."""
    from ckptio.plan.measure.host import _take_freed_page_cache, measure_writer_costs

    names = iter(range(100))

    def new_file() -> str:
        return str(tmp_path / f"chunk-{next(names)}")

    chunk = 1 << 20
    assert _take_freed_page_cache(new_file, cold_below=float("inf"), chunk=chunk, cap=16 * chunk) == 2 * chunk
    assert _take_freed_page_cache(new_file, cold_below=0.0, chunk=chunk, cap=5 * chunk) == 5 * chunk
    assert len(list(tmp_path.iterdir())) == 7

    def unwritable() -> str:
        return str(tmp_path / "missing-dir" / "chunk")

    assert _take_freed_page_cache(unwritable, cold_below=0.0, chunk=chunk, cap=4 * chunk) == 0
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    costs = measure_writer_costs(1 << 20, directory=str(probe_dir))
    assert all(rate > 0 for rate in costs.values()) and list(probe_dir.iterdir()) == []


def test_a_store_on_the_local_disk_takes_its_times_from_the_disk_and_shares_the_write_back_threshold() -> None:
    """:func:`ckptio.plan.measure.disk.on_local_disk`: the store arguments of every rank writing at once, the booking
    of a
    paced store passed through (None for the bare disk), the kernel's threshold divided among the ranks."""
    from ckptio.plan.measure.disk import DiskRates, on_local_disk
    from ckptio.plan.measure.host import dirty_background_bytes

    disk = DiskRates(direct_bytes_per_s=100.0, writeback_bytes_per_s=400.0)
    store = on_local_disk(disk, job_bytes=800.0, ranks=4, booked_s=3.0)
    assert (store["store_s"], store["writeback_store_s"], store["paced_store_s"]) == (8.0, 2.0, 3.0)
    dirty = dirty_background_bytes()
    # Read twice from /proc: MemAvailable moves a little between the reads.
    assert store["dirty_background_bytes"] == (None if dirty is None else pytest.approx(dirty / 4, rel=0.05))
    assert on_local_disk(disk, job_bytes=800.0, ranks=4)["paced_store_s"] is None
