"""SaveMetrics: the exposition, parsed back with prometheus_client's parser, matches the events fed."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ckptio.errors import ConfigError
from ckptio.obs.events import EventLog
from ckptio.obs.metrics import SaveMetrics, start_exporter
from tests.obs.obs_fakerun import FakeRun, simulate


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_exposition_matches_the_events_of_a_run_with_a_skip_and_a_failure() -> None:
    run = FakeRun(ranks=2, steps=120, flush_s=2.5, flush_growth_s=0.9, fail_step=60)
    events = simulate(run)
    registry = CollectorRegistry()
    metrics = {rank: SaveMetrics(registry, rank=rank) for rank in events}
    for rank, records in events.items():
        for record in records:
            metrics[rank].observe(record)
    samples = _samples(registry)
    for rank, records in events.items():
        r = str(rank)
        returned = [e for e in records if e["event"] == "save_returned"]
        committed = [e for e in records if e["event"] == "committed"]
        assert returned and committed and len(committed) < len(returned)  # the failure did not commit
        assert _value(samples, "ckptio_save_blocking_seconds_count", rank=r) == len(returned)
        assert _value(samples, "ckptio_save_blocking_seconds_sum", rank=r) == pytest.approx(
            sum(e["blocking_s"] for e in returned)
        )
        assert _value(samples, "ckptio_save_flush_seconds_count", rank=r) == len(committed)
        assert _value(samples, "ckptio_save_flush_seconds_sum", rank=r) == pytest.approx(
            sum(e["flush_s"] for e in committed)
        )
        for phase, tier in (("local_write", "local"), ("upload", "durable")):
            expected = sum(e["bytes"] for e in records if e["event"] == "phase" and e["phase"] == phase)
            assert expected > 0
            assert _value(samples, "ckptio_save_bytes_total", rank=r, tier=tier) == expected
        skips = sum(1 for e in records if e["event"] == "save_skipped")
        assert skips == 1
        assert _value(samples, "ckptio_saves_skipped_total", rank=r) == skips
        assert _value(samples, "ckptio_save_failures_total", rank=r) == 1
        assert _value(samples, "ckptio_flush_lag_seconds", rank=r) == pytest.approx(committed[-1]["lag_s"])
        assert _value(samples, "ckptio_last_committed_step", rank=r) == max(e["step"] for e in committed)
        last_queue = [e for e in records if e["event"] == "queue"][-1]
        assert _value(samples, "ckptio_pending_saves", rank=r) == last_queue["pending"]


def test_listener_on_an_event_log_updates_metrics(tmp_path) -> None:
    registry = CollectorRegistry()
    metrics = SaveMetrics(registry, rank=3)
    log = EventLog(str(tmp_path / "ev.jsonl"), rank=3, role="trainer")
    log.add_listener(metrics.observe)
    log.emit("save_returned", 10, blocking_s=0.02, bytes=100)
    # serialize moves no bytes onto a tier: not counted
    log.emit("phase", 10, phase="serialize", seconds=0.1, bytes=100, tier="local")
    log.emit("phase", 10, phase="upload", seconds=0.5, bytes=100, tier="durable")
    log.emit("committed", 10, flush_s=0.6, bytes=100, lag_s=0.62, interval_s=None)
    log.close()
    samples = _samples(registry)
    assert _value(samples, "ckptio_save_bytes_total", rank="3", tier="durable") == 100
    assert _value(samples, "ckptio_save_bytes_total", rank="3", tier="local") == 0
    assert _value(samples, "ckptio_last_committed_step", rank="3") == 10
    assert _value(samples, "ckptio_save_flush_seconds_count", rank="3") == 1


def test_two_instances_share_a_registry_and_the_default_one_does_not_crash() -> None:
    registry = CollectorRegistry()
    first, second = SaveMetrics(registry, rank=0), SaveMetrics(registry, rank=0)
    first.observe({"event": "save_skipped", "rank": 0, "step": 5})
    second.observe({"event": "save_skipped", "rank": 0, "step": 6})
    assert _value(_samples(registry), "ckptio_saves_skipped_total", rank="0") == 2
    # The process-wide default registry: constructing twice must reuse the collectors, not raise "Duplicated".
    SaveMetrics(rank=0)
    SaveMetrics(rank=1)


def test_observe_ignores_unknown_and_malformed_events() -> None:
    registry = CollectorRegistry()
    metrics = SaveMetrics(registry, rank=0)
    metrics.observe({"event": "from_the_future", "rank": 0})
    metrics.observe({"event": "save_returned", "rank": 0, "blocking_s": None})
    metrics.observe({"rank": 0})
    assert _value(_samples(registry), "ckptio_save_blocking_seconds_count", rank="0") == 0


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        SaveMetrics(CollectorRegistry(), rank=-1)
    with pytest.raises(ConfigError):
        SaveMetrics(object(), rank=0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        start_exporter(70000)


def test_exporter_serves_the_registry_over_http() -> None:
    registry = CollectorRegistry()
    SaveMetrics(registry, rank=0).observe({"event": "committed", "rank": 0, "step": 42, "flush_s": 1.0})
    with start_exporter(0, registry=registry) as exporter:
        assert exporter.port > 0
        with urllib.request.urlopen(exporter.url, timeout=10) as response:
            text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["ckptio_last_committed_step"].samples[0].value == 42
    exporter.close()  # closing twice is harmless
