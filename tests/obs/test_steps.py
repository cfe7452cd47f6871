"""StepTimer writes step events the report attributes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ckptio.errors import ConfigError
from ckptio.obs.events import EventLog
from ckptio.obs.report import build_timeline, load_events
from ckptio.obs.steps import StepTimer


def test_steps_become_events_and_report_samples(tmp_path) -> None:
    path = str(tmp_path / "ev.jsonl")
    log = EventLog(path, rank=0, role="trainer")
    timer = StepTimer(log)
    for step in range(3):
        with timer.step(step):
            pass
    timer.begin(np.int64(3))  # numpy integer steps are accepted
    seconds = timer.end(3)
    log.close()
    with open(path) as fh:
        records = [json.loads(line) for line in fh]
    assert [(r["event"], r["step"]) for r in records] == [
        (kind, step) for step in range(4) for kind in ("step_begin", "step_end")
    ]
    assert records[-1]["seconds"] == seconds == timer.last_seconds
    samples = build_timeline(load_events(path)).steps[0]
    assert [s.step for s in samples] == [0, 1, 2, 3]
    assert all(s.kind == "clean" for s in samples)


def test_step_is_ended_when_the_body_raises(tmp_path) -> None:
    log = EventLog(None, rank=0, role="trainer")
    seen: list[str] = []
    log.add_listener(lambda r: seen.append(r["event"]))
    timer = StepTimer(log)
    with pytest.raises(RuntimeError), timer.step(1):
        raise RuntimeError("loss is nan")
    assert seen == ["step_begin", "step_end"]
    timer.begin(2)  # the timer is usable again


def test_misuse_is_a_config_error() -> None:
    timer = StepTimer(EventLog(None, rank=0, role="trainer"))
    with pytest.raises(ConfigError, match="without a matching"):
        timer.end(1)
    timer.begin(1)
    with pytest.raises(ConfigError, match="still open"):
        timer.begin(2)
    with pytest.raises(ConfigError, match="without a matching"):
        timer.end(2)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError):
            StepTimer(EventLog(None, rank=0, role="trainer")).begin(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        StepTimer(object())  # type: ignore[arg-type]
