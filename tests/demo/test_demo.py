"""The demo end to end (real ranks, gloo, files), its Ctrl-C cleanup, and its throttled DCP writer."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed.checkpoint as dcp
from rich.console import Console

from ckptio.demo.demo_config import DemoConfig
from ckptio.demo.demo_runner import run_demo
from ckptio.demo.job import RankJob, RankResult, StoreSpec
from ckptio.demo.model import ModelShape
from ckptio.demo.throttled_store import ThrottledFileSystemWriter, ThrottleSpec
from ckptio.errors import ConfigError

TINY = ModelShape(vocab=2048, d_model=32, layers=1, heads=2, seq_len=8, batch=2, classes=16)


@pytest.mark.slow
@pytest.mark.multiproc
def test_short_demo_end_to_end(tmp_path: Path) -> None:
    console = Console(file=open(os.devnull, "w"), width=120)  # noqa: SIM115 (closed below)
    config = DemoConfig(steps=10, every=3, shape=TINY, store_bandwidth=4 * 2**20, out=str(tmp_path / "demo"))
    try:
        outcome = run_demo(config, console)
    finally:
        console.file.close()

    assert [row.mode for row in outcome.rows] == ["dcp-sync", "dcp-async", "dcp-best", "ckptio"]
    for row in outcome.rows:
        assert row.committed == [3, 6, 9], row
        assert row.saves == 3
        # The first save is apart; the steady figures are the two after it, each durable and measured.
        assert row.first is not None and row.first.step == 3
        assert row.first_durable_s is not None and row.first_durable_s > 0
        assert [s.step for s in row.steady] == [6, 9]
        assert all(s.lag_s is not None and s.lost_s >= s.stall_s > 0 for s in row.steady)
        assert row.median_step_s is not None and row.median_step_s > 0
    assert outcome.rows[-1].ready_s > 0  # ckptio's writer booted before step 1
    # The newest step of every mode stays, committed by its own rule (ckptio: the manifest; DCP: .metadata);
    # the older ones are pruned once every run is measured, so the demo leaves one checkpoint per mode on disk.
    store = tmp_path / "demo" / "store"
    assert (store / "ckptio" / "step-00000009" / "manifest.json").is_file()
    for mode in ("dcp-sync", "dcp-async", "dcp-best"):
        assert (store / mode / "step-00000009" / ".metadata").is_file()
    for mode in ("ckptio", "dcp-sync", "dcp-async", "dcp-best"):
        assert sorted(p.name for p in (store / mode).glob("step-*")) == ["step-00000009"]
    assert outcome.resume.restored_step == 9
    assert outcome.resume.bit_exact
    assert outcome.resume.resumed[10] == outcome.resume.uninterrupted[10]
    for mode in ("ckptio", "dcp-sync", "dcp-async", "dcp-best"):
        report = Path(outcome.reports[mode])
        assert report.is_file() and "<img" in report.read_text()
    assert Path(outcome.reports["ckptio"]).with_suffix(".png").is_file()
    assert outcome.prediction.sync.checkpoint_bytes == pytest.approx(TINY.state_bytes())
    # The planner's O_DIRECT input: a trial ckptio save on the job's own ranks, before any run, removed after.
    assert outcome.prediction.trial_lost_s is not None and outcome.prediction.direct_io_s_per_gib >= 0
    results = tmp_path / "demo" / "results"
    assert all((results / f"calibrate.rank{r}.json").is_file() for r in range(config.ranks))
    # ... and the rank that saves the most, what the prediction is for.
    staged = [RankResult.load(str(results / f"calibrate.rank{r}.json")).trial_bytes for r in range(config.ranks)]
    assert all(staged) and outcome.prediction.bytes_per_rank == max(staged)
    assert sum(staged) == pytest.approx(TINY.state_bytes(), rel=0.01)
    assert not (store / "calibrate").exists()  # the trial saves are removed
    # ckptio runs first, right after the trial that calibrates it; the table keeps its own order.
    finished = {m: (results / f"{m}.rank0.json").stat().st_mtime_ns for m in ("ckptio", "dcp-sync", "dcp-best")}
    assert finished["ckptio"] < finished["dcp-sync"] < finished["dcp-best"], finished
    assert not outcome.choice.chosen and outcome.choice.every == 3
    # The restore, timed against plain dcp.load of dcp.save's copy of the same step, each from a cold page cache.
    resume = outcome.resume
    assert resume.restore_s is not None and resume.restore_s > 0
    assert resume.dcp_load_s is not None and resume.dcp_load_s > 0
    assert resume.page_cache in ("drop_caches", "fadvise")
    resumed = [RankResult.load(str(results / f"resume.rank{r}.json")) for r in range(config.ranks)]
    assert resume.restore_s == max(r.restore_s or 0.0 for r in resumed)
    assert "Verdict" in outcome.verdict and "bit-exact" in outcome.verdict
    ratio = f"{resume.restore_s / resume.dcp_load_s:.2f}"
    assert re.search(rf"resume \S*bit-exact\S*, restore {resume.restore_s:.2f} s = {ratio}x dcp\.load; planner",
                      outcome.verdict), outcome.verdict


@pytest.mark.slow
@pytest.mark.multiproc
def test_ctrl_c_ends_every_process(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    with open(tmp_path / "stderr.log", "wb") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-m", "ckptio._cli.main", "demo", "--quick", "--steps=400", f"--out={out}"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    launcher = psutil.Process(demo.pid)
    deadline = time.monotonic() + 120
    # Wait until the ranks have joined (training is starting), then interrupt as a terminal's Ctrl-C would.
    while time.monotonic() < deadline and not _ranks_joined(out / "run" / "logs"):
        assert demo.poll() is None, (tmp_path / "stderr.log").read_text()
        time.sleep(0.2)
    spawned = launcher.children(recursive=True)
    assert len(spawned) >= 2
    demo.send_signal(signal.SIGINT)
    assert demo.wait(timeout=60) == 130
    assert "interrupted" in (tmp_path / "stderr.log").read_text()
    _gone, alive = psutil.wait_procs(spawned, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def _ranks_joined(log_dir: Path) -> bool:
    logs = list(log_dir.glob("ckptio-*.rank*.log"))  # the runs launch ckptio first
    return len(logs) >= 2 and all("joined" in log.read_text(errors="replace") for log in logs)


def _clock(path: str) -> float:
    with open(path, "rb") as f:
        raw = f.read(8)
    return struct.unpack("d", raw)[0] if len(raw) == 8 else 0.0


def test_dcp_writer_books_its_bytes_on_the_shared_clock(tmp_path: Path) -> None:
    bandwidth = 1e9
    throttle = ThrottleSpec(bytes_per_s=bandwidth, state_path=str(tmp_path / "clock"))
    state = {"a": torch.arange(1 << 16, dtype=torch.float32), "b": torch.ones(3, 5, dtype=torch.float64)}
    tensor_bytes = (1 << 16) * 4 + 15 * 8
    # Start the shared clock a little in the future, as if another writer held the store: the booking must
    # begin there and last exactly bytes / bandwidth.
    busy_until = time.monotonic() + 0.3
    with open(throttle.state_path, "wb") as f:
        f.write(struct.pack("d", busy_until))
    dcp.save(state, storage_writer=ThrottledFileSystemWriter(str(tmp_path / "ckpt"), throttle=throttle))
    booked = _clock(throttle.state_path) - busy_until
    assert booked == pytest.approx(tensor_bytes / bandwidth, rel=0.05)
    loaded = {"a": torch.zeros(1 << 16), "b": torch.zeros(3, 5, dtype=torch.float64)}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "ckpt"))
    assert torch.equal(loaded["a"], state["a"]) and torch.equal(loaded["b"], state["b"])


def test_job_round_trips_through_json(tmp_path: Path) -> None:
    store = StoreSpec(root=str(tmp_path), bytes_per_s=1e6, throttle_state=str(tmp_path / "t"))
    job = RankJob(
        runs=["dcp-sync", "ckptio"],
        world=2,
        store_port=1234,
        steps=10,
        every=4,
        seed=3,
        shape=TINY,
        stores={"dcp-sync": store, "ckptio": store},
        events_dir=str(tmp_path),
        results_dir=str(tmp_path),
        progress_path=str(tmp_path / "p"),
    )
    job.dump(str(tmp_path / "job.json"))
    assert RankJob.load(str(tmp_path / "job.json")) == job
    assert job.save_steps() == [4, 8]
    assert json.loads((tmp_path / "job.json").read_text())["shape"]["vocab"] == TINY.vocab
    for alone in ("resume", "calibrate"):  # each starts from fresh processes: a resume, or before any save
        with pytest.raises(ConfigError, match=alone):
            RankJob(
                **{
                    **asdict(job),
                    "shape": TINY,
                    "stores": {alone: store, "ckptio": store},
                    "runs": ["ckptio", alone],
                }
            )


@pytest.mark.parametrize(
    "changes",
    [{"ranks": 0}, {"steps": 5, "every": 5}, {"store_bandwidth": 0}, {"store": "nfs"}, {"ranks": 3}, {"saves": 1}],
)
def test_bad_demo_options_are_config_errors(changes: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        DemoConfig(**changes)  # type: ignore[arg-type]


def test_cli_parses_bandwidth_and_quick() -> None:
    from ckptio._cli.demo_cmd import build_config
    from ckptio._cli.main import build_parser

    args = build_parser().parse_args(["demo", "--quick", "--store-bandwidth", "200MiB/s", "--ranks", "4"])
    config = build_config(args)
    assert config.store_bandwidth == 200 * 2**20
    assert config.ranks == 4 and config.shape.state_bytes() < DemoConfig().shape.state_bytes()
    assert config.every is None and config.steps is None  # the planner picks the interval
    args = build_parser().parse_args(["demo", "--every", "7", "--saves", "3"])
    assert (build_config(args).every, build_config(args).saves) == (7, 3)
    bad = build_parser().parse_args(["demo", "--store-bandwidth", "fast"])
    with pytest.raises(ConfigError):
        build_config(bad)


@pytest.mark.s3
def test_embedded_s3_store_takes_a_throttled_write(tmp_path: Path) -> None:
    pytest.importorskip("moto.server")
    from ckptio.demo.savers import committed_steps, open_demo_storage
    from ckptio.testing.moto_s3 import BUCKET, embedded_s3

    before = os.environ.get("AWS_ENDPOINT_URL")
    with embedded_s3() as endpoint:
        assert endpoint.startswith("http://127.0.0.1:")
        spec = StoreSpec(
            kind="s3",
            root=f"s3://{BUCKET}/run",
            bytes_per_s=1e9,
            throttle_state=str(tmp_path / "clock"),
            options={"endpoint_url": endpoint, "region": "us-east-1"},
        )
        storage = open_demo_storage(spec)
        storage.put("step-00000003/manifest.json", b"{}")
        storage.put("step-00000006/ranks/0.json", b"{}")  # not committed: no manifest
        assert committed_steps(storage, "manifest.json") == [3]
        assert _clock(spec.throttle_state) > 0  # the write was booked on the shared clock
    assert os.environ.get("AWS_ENDPOINT_URL") == before


@pytest.mark.parametrize("layers", [1, 3])
def test_the_demo_counts_the_entries_of_its_state_as_dcp_flattens_them(layers: int) -> None:
    """:meth:`ModelShape.state_items`, the planner's per-item input, is the number of entries DCP's flattening gives
    one rank's state (a wrong count would move DCP-best's prediction silently)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    from ckptio.demo.model import Trainer, TrainState

    shape = ModelShape(vocab=64, d_model=8, layers=layers, heads=2, seq_len=4, batch=2, classes=4, pool=2)
    state = TrainState(Trainer(shape, rank=0, world=1, seed=0), mesh=None).state_dict()
    flat, _ = flatten_state_dict(state)
    assert shape.state_items() == len(flat)
