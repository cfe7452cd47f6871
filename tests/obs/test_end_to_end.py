"""A real 2-rank gloo run with Checkpointer + StepTimer: events complete and ordered, skips on every rank,
metrics and the report agree with the events."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ckptio.obs.events import rank_path
from ckptio.obs.report import load_events, summarize, write_report
from ckptio.testing.ranks import run_ranks
from tests.obs.obs_workers import SAVE_STEPS, STEPS, train_with_checkpoints

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

WORLD = 2
# stage_end may come after save_returned: the copy runs on the staging thread (staging="async").
ORDER = ("save_requested", "save_agreed", "stage_begin", "save_returned", "committed")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("e2e")
    (base / "ckpt").mkdir()
    events_path = str(base / "events.jsonl")
    run_ranks(WORLD, train_with_checkpoints, str(base / "ckpt"), events_path, str(base))
    return {"base": base, "events_path": events_path}


def _by_rank(records: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in records:
        out.setdefault(r["rank"], []).append(r)
    return out


def test_every_save_has_a_complete_ordered_set_of_events_on_every_rank(run) -> None:
    records = load_events(run["events_path"])
    ranks = _by_rank(records)
    assert sorted(ranks) == list(range(WORLD))
    for rank, events in ranks.items():
        assert (run["base"] / f"skipped{rank}.txt").read_text() == "3"
        committed = sorted(e["step"] for e in events if e["event"] == "committed")
        assert committed == [2, 7]
        for step in committed:
            mine = [e for e in events if e.get("step") == step and not e["event"].startswith("step_")]
            first = {}
            for e in mine:
                first.setdefault(e["event"], e["mono"])
            assert [first[name] for name in ORDER] == sorted(first[name] for name in ORDER), (rank, step)
            phases = [e for e in mine if e["event"] == "phase"]
            assert {"serialize", "upload", "rank_index"} <= {e["phase"] for e in phases}
            assert all(e["role"] == "writer" for e in phases)
            # Retention (rank 0) runs once the commit is reported; every other phase happens before the commit.
            assert all(first["stage_end"] < e["mono"] < first["committed"] for e in phases
                       if e["phase"] != "retention")
            manifest = [e["mono"] for e in phases if e["phase"] == "manifest"]
            assert all(e["mono"] > max(manifest) for e in phases if e["phase"] == "retention")
        skipped = [e for e in events if e.get("step") == 3 and not e["event"].startswith("step_")]
        assert [e["event"] for e in skipped] == ["save_requested", "save_skipped"]
        steps = [e["step"] for e in events if e["event"] == "step_end"]
        assert steps == list(range(1, STEPS + 1))


def test_metrics_of_each_rank_match_its_events(run) -> None:
    ranks = _by_rank(load_events(run["events_path"]))
    for rank, events in ranks.items():
        text = (run["base"] / f"metrics{rank}.txt").read_text()
        samples = {
            (s.name, s.labels.get("tier")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.labels.get("rank") == str(rank)
        }
        returned = [e for e in events if e["event"] == "save_returned"]
        assert samples[("ckptio_save_blocking_seconds_count", None)] == len(returned) == 2
        assert samples[("ckptio_save_flush_seconds_count", None)] == 2
        assert samples[("ckptio_saves_skipped_total", None)] == 1
        assert samples[("ckptio_save_failures_total", None)] == 0
        assert samples[("ckptio_last_committed_step", None)] == 7
        uploaded = sum(e["bytes"] for e in events if e["event"] == "phase" and e["phase"] == "upload")
        assert uploaded > 0
        assert samples[("ckptio_save_bytes_total", "durable")] == uploaded


def test_report_summary_matches_the_events(run) -> None:
    records = load_events(run["events_path"])
    summary = summarize(records)
    assert summary.saves == len(SAVE_STEPS)
    assert summary.skipped_steps == [3]
    assert summary.committed == 2 and summary.failed_steps == []
    for rank_summary in summary.ranks:
        events = [r for r in records if r["rank"] == rank_summary.rank]
        assert sum(rank_summary.steps.values()) == STEPS
        assert rank_summary.steps["staging"] >= 2  # the steps that called save() (3's agreement included)
        assert rank_summary.blocking_s == pytest.approx(
            sum(e["blocking_s"] for e in events if e["event"] == "save_returned")
        )
        assert rank_summary.bytes == sum(e["bytes"] for e in events if e["event"] == "committed")
    assert any("skipped" in v and "3" in v for v in summary.verdicts)
    png = run["base"] / "report.png"
    write_report(records, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert rank_path(run["events_path"], 1).endswith("events.rank1.jsonl")
