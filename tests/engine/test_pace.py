"""Paced flushes (``flush_pace``): the rate each save gets, the waits a paced write takes (on a fake clock), full
speed when the next save, an emergency save or ``close()`` needs it, a node's budget shared by its writers, and the
events, metrics and report verdict that show it. The end-to-end tests run the real writer on real files."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

import ckptio
from ckptio.engine.trainer.pace_rule import PaceRule
from ckptio.engine.writer.flush_pacer import FlushPacer
from ckptio.errors import ConfigError
from ckptio.format import committed_steps
from ckptio.obs.eventfiles import load_events
from ckptio.obs.events import rank_path
from ckptio.obs.summary import summarize
from ckptio.storage import open_storage
from tests.engine.engine_workers import run_ranks

MiB = 1 << 20


class FakeTime:
    """A clock that only moves when a paced write waits (no real sleeping)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.lock = threading.Lock()

    def clock(self) -> float:
        return self.now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if not event.is_set():
            with self.lock:
                self.now += seconds
        return event.is_set()


def test_a_paced_flush_of_x_bytes_at_rate_r_takes_x_over_r():
    t = FakeTime()
    pacer = FlushPacer(clock=t.clock, wait=t.wait)
    pacer.job_arrived()
    pacer.job_started()
    with pacer.begin(8 * MiB) as flush:  # 8 MiB/s
        for _ in range(32):  # 32 MiB in 1 MiB pieces
            flush.take(MiB)
    report = flush.report
    assert report is not None and report.bytes == 32 * MiB and not report.hurried
    # The first piece goes at once; each later one waits for its ticket: 31 MiB at 8 MiB/s.
    assert report.seconds == pytest.approx(31 / 8) and report.stretched_s == pytest.approx(31 / 8)
    assert report.achieved_bytes_per_s == pytest.approx(32 * MiB / (31 / 8))


def test_full_speed_when_the_next_save_arrives_or_the_trainer_asks():
    t = FakeTime()
    pacer = FlushPacer(clock=t.clock, wait=t.wait)
    pacer.job_arrived()
    pacer.job_started()
    with pacer.begin(MiB) as flush:
        flush.take(MiB)
        flush.take(MiB)  # waits 1 s
        pacer.job_arrived()  # the next save is queued behind this flush
        for _ in range(10):
            flush.take(MiB)  # no more waiting
    assert flush.report is not None and flush.report.hurried and flush.report.stretched_s == pytest.approx(1.0)
    pacer.job_started()
    with pacer.begin(MiB) as second:
        pacer.hurry()  # close(), or a save that found its slot busy
        second.take(MiB)
        second.take(MiB)
    assert second.report is not None and second.report.hurried and second.report.stretched_s == 0.0
    pacer.job_arrived()
    pacer.hurry()  # asked before the job began its flush (still serializing): it covers that job too
    pacer.job_started()
    with pacer.begin(MiB) as third:
        third.take(MiB)
        third.take(MiB)
    assert third.report is not None and third.report.stretched_s == 0.0
    pacer.job_arrived()
    pacer.job_started()
    with pacer.begin(MiB) as fourth:  # a later job, nothing asked: paced again
        fourth.take(MiB)
        fourth.take(MiB)
    assert fourth.report is not None and fourth.report.stretched_s == pytest.approx(1.0)


def test_waits_of_concurrent_writers_count_once():
    t = FakeTime()
    pacer = FlushPacer(clock=t.clock, wait=t.wait)
    pacer.job_arrived()
    pacer.job_started()
    with pacer.begin(4 * MiB) as flush:
        threads = [threading.Thread(target=lambda: [flush.take(MiB) for _ in range(4)]) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert flush.report is not None and flush.report.bytes == 8 * MiB
    assert flush.report.stretched_s <= flush.report.seconds + 1e-9


def test_the_rate_of_each_save():
    assert PaceRule(None, fraction=0.5, ranks_on_node=4, every_seconds=None).rate(MiB) is None
    assert PaceRule(8e9, fraction=0.5, ranks_on_node=4, every_seconds=None).rate(MiB) == 2e9  # the node's budget
    auto = PaceRule("auto", fraction=0.5, ranks_on_node=4, every_seconds=None)
    assert auto.rate(100 * MiB) is None  # no interval measured yet: full speed
    auto.observe(300.0)
    assert auto.rate(100 * MiB) is None  # one interval may be a pause (an evaluation after the first save)
    auto.observe(10.0)
    assert auto.rate(100 * MiB) == pytest.approx(100 * MiB / 5.0)  # done within half the shortest interval
    auto.observe(300.0)  # long pauses never slow the next flush, even two of the last three
    assert auto.rate(100 * MiB) == pytest.approx(100 * MiB / 5.0)
    auto.observe(30.0)  # the interval grew (longer steps): it takes over once the shorter one aged out
    assert auto.rate(100 * MiB) == pytest.approx(100 * MiB / 5.0)
    auto.observe(30.0)
    assert auto.rate(100 * MiB) == pytest.approx(100 * MiB / 15.0)
    auto.observe(3.0)  # a shorter interval takes over at once
    assert auto.rate(100 * MiB) == pytest.approx(100 * MiB / 1.5)
    timed = PaceRule("auto", fraction=0.25, ranks_on_node=1, every_seconds=40.0)
    assert timed.rate(100 * MiB) == pytest.approx(100 * MiB / 10.0)  # every_seconds is the first estimate
    timed.observe(20.0)  # saves called more often than every_seconds: the shorter interval rules
    assert timed.rate(100 * MiB) == pytest.approx(100 * MiB / 5.0)


@pytest.mark.parametrize("bad", [0, -1.0, "fast", float("nan")])
def test_bad_paces_are_refused(tmp_path, bad):
    with pytest.raises(ConfigError):
        ckptio.Checkpointer(str(tmp_path), flush_pace=bad)


def _state(mib: int, seed: int) -> dict:
    return {"w": torch.full((mib * MiB // 4,), float(seed))}


def _records(path: Path, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in Path(rank_path(str(path), rank)).read_text().splitlines()]


def test_a_paced_save_commits_goes_full_speed_for_the_next_save_and_close(tmp_path):
    """2 MB/s for 6 MiB saves (3 s each if paced to the end): the second save arrives while the first flush is
    paced, and close() arrives during the second; both finish at full speed, and every save commits."""
    events = tmp_path / "ev.jsonl"
    registry = CollectorRegistry()
    ck = ckptio.Checkpointer(str(tmp_path / "root"), flush_pace=2e6, lease_s=0, volume_check="off", fsync=False,
                             events_path=str(events), metrics_registry=registry, max_pending=2)
    try:
        ck.save(1, _state(6, 1))
        ck.wait_staged()
        ck.save(2, _state(6, 2))
    finally:
        ck.close()
    assert committed_steps(open_storage(str(tmp_path / "root"))) == [1, 2]
    paced = {r["step"]: r for r in _records(events) if r["event"] == "flush_paced"}
    assert set(paced) == {1, 2} and all(r["hurried"] for r in paced.values()), paced
    assert all(r["target_bytes_per_s"] == 2e6 and r["tier"] == "durable" for r in paced.values())
    target = registry.get_sample_value("ckptio_flush_pace_target_bytes_per_second",
                                       {"rank": "0", "tier": "durable"})
    assert target == 2e6
    assert registry.get_sample_value("ckptio_flush_pace_stretch_seconds_count", {"rank": "0", "tier": "durable"}) == 2


def test_an_emergency_save_is_never_paced(tmp_path):
    events = tmp_path / "ev.jsonl"
    with ckptio.Checkpointer(str(tmp_path / "root"), flush_pace=1e6, lease_s=0, volume_check="off", fsync=False,
                             events_path=str(events), max_pending=2) as ck:
        ck.save(1, _state(4, 1))
        ck.wait_staged()
        ck.emergency_save(2, _state(4, 2))
    paced = {r["step"]: r for r in _records(events) if r["event"] == "flush_paced"}
    assert set(paced) == {1} and paced[1]["hurried"], paced  # step 2 went at full speed, and made step 1 hurry
    assert committed_steps(open_storage(str(tmp_path / "root"))) == [1, 2]


def _paced_rank(rank: int, world_size: int, root: str, events: str) -> None:
    with ckptio.Checkpointer(root, flush_pace=64e6, lease_s=0, volume_check="off", fsync=False,
                             events_path=events) as ck:
        ck.save(1, {f"w{rank}": torch.ones(MiB // 4)}).wait()


@pytest.mark.multiproc
def test_a_nodes_budget_is_shared_by_its_writers(tmp_path):
    events = str(tmp_path / "ev-{rank}.jsonl")
    run_ranks(2, _paced_rank, str(tmp_path / "root"), events)
    for rank in range(2):  # both ranks on this one node: each writer gets half of the node's 64 MB/s
        (paced,) = [r for r in _records(Path(events), rank) if r["event"] == "flush_paced"]
        assert paced["target_bytes_per_s"] == 32e6, paced


def test_the_report_says_paced_flushes_keep_up(tmp_path):
    events = tmp_path / "ev.jsonl"
    with ckptio.Checkpointer(str(tmp_path / "root"), flush_pace="auto", lease_s=0, volume_check="off",
                             fsync=False, events_path=str(events)) as ck:
        for step in range(1, 5):
            ck.save(step, _state(1, step)).wait()
            threading.Event().wait(0.3)  # the interval "auto" paces to
    summary = summarize(load_events([rank_path(str(events), 0)]))
    assert summary.paced_saves == 2  # the first two had no interval to pace to, or only one
    assert any(v.startswith("paced flushes keep up") for v in summary.verdicts), summary.verdicts
