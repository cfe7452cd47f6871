"""Every accepted option value works (issue 21, item 7): no wait takes a timeout past ``threading.TIMEOUT_MAX``
(``ckptio._wait``), and the Checkpointer and the command line accept the same flush paces (``ckptio._pace_option``).

Real writer processes and real files: a save paced for ``every_seconds=1e11`` ("never by time") commits once the
next save or ``close()`` hurries it, and "forever" timeouts passed by a caller wait instead of raising
``OverflowError: timestamp out of range``.
"""

from __future__ import annotations

import threading

import pytest
import torch

import ckptio
from ckptio._cli.main import main
from ckptio._wait import MAX_TIMEOUT_S, MAX_WAIT_S, bounded
from ckptio.config import CheckpointerConfig
from ckptio.errors import ConfigError
from ckptio.format import committed_steps
from ckptio.storage import open_storage

FOREVER = 1e20
"""A caller's "forever": past threading.TIMEOUT_MAX (about 9.2e9 s)."""


OPTIONS: dict[str, object] = {"lease_s": 0, "volume_check": "off", "fsync": False}


def test_bounded_keeps_every_timeout_within_what_the_platform_waits_take():
    assert MAX_WAIT_S == threading.TIMEOUT_MAX
    assert bounded(None) is None and bounded(-3.0) == 0.0 and bounded(2.5) == 2.5
    assert bounded(FOREVER) == bounded(float("inf")) == MAX_WAIT_S
    assert not threading.Event().wait(bounded(-1.0))


def test_auto_pace_with_a_huge_every_seconds_commits_once_hurried(tmp_path):
    """``every_seconds=1e11`` makes the first flush's pace a fraction of a byte a second: each piece's ticket lies
    centuries ahead. Before, the wait overflowed and failed the save; now it waits until the next save hurries it."""
    root = str(tmp_path / "root")
    state = {"w": torch.ones(3 << 20)}  # 12 MiB: two paced slices of a file, the second with a ticket to wait for
    with ckptio.Checkpointer(root, flush_pace="auto", every_seconds=1e11, every_steps=1, max_pending=2,
                             **OPTIONS) as ck:
        first = ck.save(1, state)
        ck.wait_staged()
        second = ck.save(2, {"w": torch.full((3 << 20,), 2.0)})  # the next save: the first flush goes full speed
        first.wait(timeout=FOREVER)
        second.wait(timeout=FOREVER)
    assert committed_steps(open_storage(root)) == [1, 2]


def test_a_callers_forever_timeout_waits_instead_of_overflowing(tmp_path):
    root = str(tmp_path / "root")
    ck = ckptio.Checkpointer(root, **OPTIONS)
    assert ck.writer_ready(timeout=FOREVER)
    handle = ck.save(1, {"w": torch.ones(8)})
    handle.wait_staged(timeout=FOREVER)
    ck.wait_staged(timeout=FOREVER)
    handle.wait(timeout=FOREVER)
    ck.wait(timeout=FOREVER)
    ck.save(2, {"w": torch.ones(8)})
    ck.close(timeout=FOREVER)
    assert committed_steps(open_storage(root)) == [1, 2]


@pytest.mark.parametrize("name", ["commit_timeout_s", "close_timeout_s", "partner_timeout_s", "preempt_grace_s"])
def test_a_timeout_option_is_refused_past_the_bound_its_waits_can_take(tmp_path, name):
    CheckpointerConfig(root=str(tmp_path), **{name: MAX_TIMEOUT_S})
    with pytest.raises(ConfigError, match=name):
        CheckpointerConfig(root=str(tmp_path), **{name: MAX_TIMEOUT_S * 10})


PACES = [0.5, 1.0, 1e-4, 2e9, 1e15, 2e15, "auto"]
FRACTIONS = [0.005, 0.01, 0.5, 1.0, 1.5]
JOB = ["--preset", "mlperf-llama3-8b", "--write-bandwidth", "20GB/s"]


def _api_accepts(tmp_path, **option: object) -> bool:
    try:
        CheckpointerConfig(root=str(tmp_path), **option)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("pace", PACES)
def test_the_checkpointer_and_the_cli_accept_the_same_flush_paces(tmp_path, capsys, pace):
    cli = main(["plan", *JOB, "--flush-pace", str(pace), "--json"]) == 0
    capsys.readouterr()
    assert _api_accepts(tmp_path, flush_pace=pace) == cli


@pytest.mark.parametrize("fraction", FRACTIONS)
def test_the_checkpointer_and_the_cli_accept_the_same_pace_fractions(tmp_path, capsys, fraction):
    cli = main(["plan", *JOB, "--flush-pace", "auto", "--flush-pace-fraction", str(fraction), "--json"]) == 0
    capsys.readouterr()
    assert _api_accepts(tmp_path, flush_pace="auto", flush_pace_fraction=fraction) == cli
