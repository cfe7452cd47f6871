"""The report: summary numbers recomputed independently from the raw events, rendering, bad event files."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from ckptio._cli.main import main
from ckptio.errors import ConfigError, CorruptCheckpointError
from ckptio.obs.report import build_timeline, load_events, summarize, summary_to_json, write_report
from tests.obs.obs_fakerun import FakeRun, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_files(tmp_path_factory) -> list[str]:
    """Two ranks on 'different hosts' (skewed monotonic clocks), a store falling behind: a skip, a failure."""
    run = FakeRun(
        steps=120, flush_s=2.5, flush_growth_s=0.9, noise=0.05, fail_step=40, clock_skew={1: 5000.0}, seed=3
    )
    return write_run(run, str(tmp_path_factory.mktemp("run") / "events.jsonl"))


def _recompute(records: list[dict]) -> dict:
    """The report's definitions (module docstring of obs.report), written again the plain way, per rank."""
    per_rank: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        per_rank[r["rank"]].append(r)
    out: dict = {"lost": [], "kinds": defaultdict(list), "bytes": 0}
    flush_by_step: dict[int, list[float]] = defaultdict(list)
    lag_by_step: dict[int, list[float]] = defaultdict(list)
    for events in per_rank.values():
        at = {
            kind: {e["step"]: e["mono"] for e in events if e["event"] == kind}
            for kind in ("save_requested", "save_returned", "save_skipped", "committed", "save_failed")
        }
        req, ret, skip = at["save_requested"], at["save_returned"], at["save_skipped"]
        end_flush = at["committed"] | at["save_failed"]
        spans_stage = [(req[s], ret.get(s, skip.get(s))) for s in req]
        spans_flush = [(ret[s], end_flush[s]) for s in ret]
        kinds = []
        for e in (e for e in events if e["event"] == "step_end"):
            a, b = e["mono"] - e["seconds"], e["mono"]
            if any(min(b, hi) - max(a, lo) > 1e-6 for lo, hi in spans_stage):
                kind = "staging"
            elif any(min(b, hi) - max(a, lo) > 1e-6 for lo, hi in spans_flush):
                kind = "flush"
            else:
                kind = "clean"
            kinds.append((kind, e["seconds"]))
            out["kinds"][kind].append(e["seconds"])
        clean = np.mean([s for k, s in kinds if k == "clean"])
        contention = max(0.0, sum(s - clean for k, s in kinds if k == "flush"))
        blocking = sum(e["blocking_s"] for e in events if e["event"] == "save_returned")
        out["lost"].append(blocking + contention)
        for e in (e for e in events if e["event"] == "committed"):
            out["bytes"] += e["bytes"]
            flush_by_step[e["step"]].append(e["flush_s"])
            lag_by_step[e["step"]].append(e["lag_s"])
    failed = {e["step"] for e in records if e["event"] == "save_failed"}
    complete = sorted(s for s in lag_by_step if s not in failed)
    out["throughput"] = out["bytes"] / sum(max(flush_by_step[s]) for s in complete)
    out["lags"] = [max(lag_by_step[s]) for s in complete]
    return out


def test_summary_equals_numbers_recomputed_from_the_events(run_files) -> None:
    records = load_events(run_files)
    summary = summarize(records)
    expected = _recompute(records)
    assert summary.lost_s == pytest.approx(max(expected["lost"]))
    assert sorted(r.lost_s for r in summary.ranks) == pytest.approx(sorted(expected["lost"]))
    for kind in ("clean", "flush", "staging"):
        values = expected["kinds"][kind]
        assert len(values) > 0
        assert summary.step_s[kind]["p50"] == pytest.approx(np.percentile(values, 50))
        assert summary.step_s[kind]["p99"] == pytest.approx(np.percentile(values, 99))
    assert sum(sum(r.steps.values()) for r in summary.ranks) == 2 * 120
    assert summary.bytes == expected["bytes"]
    assert summary.flush_throughput_Bps == pytest.approx(expected["throughput"])
    assert [lag for _, lag in summary.lags] == pytest.approx(expected["lags"])
    assert summary.lag_growth_s_per_save == pytest.approx(
        np.polyfit(range(len(expected["lags"])), expected["lags"], 1)[0]
    )
    assert summary.skipped_steps == sorted({r["step"] for r in records if r["event"] == "save_skipped"})
    assert len(summary.skipped_steps) == 1
    assert summary.failed_steps == [40]
    assert summary.saves == len({r["step"] for r in records if r["event"] == "save_requested"})
    assert summary.committed == summary.saves - 2  # the skipped and the failed one


def test_verdicts_name_the_findings(run_files) -> None:
    verdicts = summarize(load_events(run_files)).verdicts
    text = "\n".join(verdicts)
    assert verdicts[0].startswith("checkpoints cost ")
    assert "flush never catches up: lag grows" in text
    assert "skipped" in text and "failed (StorageError)" in text
    assert "steps during a flush are" in text
    assert "disagreed" not in text


def test_a_healthy_run_says_so(tmp_path) -> None:
    run = FakeRun(steps=60, every=20, flush_s=0.3, contention=1.0, stage_s=0.001)
    summary = summarize(load_events(write_run(run, str(tmp_path / "ev.jsonl"))))
    assert summary.skipped_steps == [] and summary.failed_steps == []
    assert summary.contention_s == pytest.approx(0.0, abs=1e-9)
    assert any("no checkpoint cost worth chasing" in v for v in summary.verdicts)


def test_slow_steps_that_come_with_or_without_a_flush_are_not_charged_to_it(tmp_path) -> None:
    # Every 7th step (7 and the save interval 20 share no factor) takes three times as long, flushing or not;
    # the flush itself costs nothing. Against the median clean step, every flush would be charged its share of
    # those slow steps.
    run = FakeRun(steps=700, every=20, flush_s=1.5, contention=1.0, stage_s=0.001, hiccup_every=7, hiccup_x=3.0)
    summary = summarize(load_events(write_run(run, str(tmp_path / "ev.jsonl"))))
    clean = [e for e in build_timeline(load_events(str(tmp_path / "ev.rank{rank}.jsonl"))).steps[0]
             if e.kind == "clean"]
    skew = np.mean([s.seconds for s in clean]) - np.median([s.seconds for s in clean])
    median_charge = summary.ranks[0].steps["flush"] * skew
    assert skew > 0.05 and median_charge > 5.0
    assert summary.contention_s < 0.2 * median_charge


def test_a_skip_on_one_rank_only_is_flagged(tmp_path) -> None:
    files = write_run(FakeRun(steps=40, every=10), str(tmp_path / "ev.jsonl"))
    with open(files[0], "a") as fh:
        record = {"ts": 2e9, "mono": 9e5, "rank": 0, "role": "trainer", "event": "save_skipped", "step": 999}
        fh.write(json.dumps(record) + "\n")
    verdicts = summarize(load_events(files)).verdicts
    assert any("step 999 skipped on rank(s) [0] only" in v for v in verdicts)


def test_renders_png_and_html(run_files, tmp_path) -> None:
    records = load_events(run_files)
    png, page = tmp_path / "report.png", tmp_path / "report.html"
    summary = write_report(records, str(png))
    assert png.read_bytes()[:8] == PNG_MAGIC
    write_report(records, str(page), title="run <7>")
    html = page.read_text()
    assert '<img alt="checkpoint timeline per rank" src="data:image/png;base64,' in html
    assert "<table" in html and "run &lt;7&gt;" in html
    assert all(v.split(":")[0] in html for v in summary.verdicts)
    with pytest.raises(ConfigError, match=r"\.png or \.html"):
        write_report(records, str(tmp_path / "report.pdf"))


def test_cli_json_and_out(run_files, tmp_path, capsys) -> None:
    out = tmp_path / "r.html"
    events_path = run_files[0].replace(".rank0", "")  # the configured events_path finds every rank's file
    assert main(["report", events_path, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(summary_to_json(summarize(load_events(run_files))))
    assert out.read_text().startswith("<!doctype html>")
    assert main(["report", str(tmp_path / "missing.jsonl"), "--json"]) == 2
    assert main(["report", events_path]) == 2  # neither --out nor --json


@pytest.mark.parametrize(
    ("content", "line", "what"),
    [
        (b'{"ts":1,"mono":1,"rank":0,"event":"queue","step":null}\n{"ts":1,"mono":2,"ra', 2, "truncated"),
        (b'{"ts":1,"mono":1,"rank":0,"event":"queue"}\n\nnot json at all\n', 3, "not JSON"),
        (b"[1, 2]\n", 1, "JSON object"),
        (b'{"ts":1,"mono":1,"event":"queue"}\n', 1, "missing field"),
        (b'{"ts":"x","mono":1,"rank":0,"event":"queue"}\n', 1, "numbers"),
        (b'{"ts":1,"mono":1,"rank":0,"event":"queue"}\n\xff\xfe\n', 2, "not JSON"),
    ],
)
def test_bad_event_files_name_file_and_line(tmp_path, content, line, what) -> None:
    path = tmp_path / "ev.rank0.jsonl"
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError, match=rf"line {line}: .*{what}") as info:
        load_events([str(path)])
    assert info.value.path == str(path)
    assert main(["report", str(path), "--json"]) == 1


def test_unknown_events_are_skipped_and_duplicates_kept_once(tmp_path) -> None:
    path = tmp_path / "ev.jsonl"
    known = {"ts": 1, "mono": 1, "rank": 0, "role": "trainer", "event": "queue", "step": None, "pending": 0}
    future = {**known, "event": "from_a_newer_version"}
    path.write_text("\n".join(json.dumps(r) for r in (known, future, known)) + "\n")
    assert load_events([str(path), str(tmp_path)]) == [known]


def test_a_log_without_step_events_still_reports_saves(tmp_path) -> None:
    files = write_run(FakeRun(steps=40, every=10), str(tmp_path / "ev.jsonl"))
    records = [r for r in load_events(files) if not r["event"].startswith("step_")]
    summary = write_report(records, str(tmp_path / "r.png"))
    assert summary.lost_fraction is None and summary.committed == 4
    assert summary.verdicts[0].startswith("no step events: save() blocked")
    assert (tmp_path / "r.png").read_bytes()[:8] == PNG_MAGIC
