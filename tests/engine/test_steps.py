"""Steps (issue 09, item 3): what a step may be, a step saved twice, rollback after a restore, saves below the newest.

Real writer processes and real files throughout.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import ckptio
from ckptio import format as fmt
from ckptio._cli.main import main as cli
from ckptio.engine.trainer.staging_area import SHM_DIR, SLOT_PREFIX
from ckptio.errors import CommitError, ConfigError
from ckptio.storage import PosixStorage
from ckptio.testing.wrappers import ThrottledStorage


def _slot_files(pid: int) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SLOT_PREFIX}{pid}-")]


def _restore_w(ck: ckptio.Checkpointer, step: int | None = None, n: int = 8) -> tuple[int | None, torch.Tensor]:
    target = {"w": torch.zeros(n)}
    return ck.restore(target, step=step), target["w"]


def test_a_bad_step_is_a_config_error_and_the_writer_is_untouched(root):
    with ckptio.Checkpointer(root, every_steps=2) as ck:
        assert ck.writer_ready(timeout=120)
        pid = ck._writer.pid
        for bad in (1.5, None, "7", -1, True, 2.0, [3]):
            with pytest.raises(ConfigError, match="step must be an int >= 0"):
                ck.save(bad, {"w": torch.ones(8)})  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="step must be an int >= 0"):
                ck.maybe_save(bad, {"w": torch.ones(8)})  # type: ignore[arg-type]
        assert ck._writer.pid == pid and ck._writer.alive
        ck.save(3, {"w": torch.full((8,), 3.0)}).wait(timeout=120)  # a later valid save commits
        ck.save(np.int64(4), {"w": torch.full((8,), 4.0)}).wait(timeout=120)  # integer scalars are converted
        ck.save(torch.tensor(5), {"w": torch.full((8,), 5.0)}).wait(timeout=120)
        assert ck.pending_steps() == []
    assert sorted(os.listdir(root)) == ["latest", "step-00000003", "step-00000004", "step-00000005"]
    assert _slot_files(os.getpid()) == []


def test_maybe_save_without_an_interval_is_a_config_error(root):
    with ckptio.Checkpointer(root, start_writer="on_first_save") as ck, \
            pytest.raises(ConfigError, match="every_steps or every_seconds"):
        ck.maybe_save(10, {"w": torch.ones(8)})


def test_a_step_saved_twice_is_superseded_by_the_later_save_and_both_handles_tell_the_truth(root, capsys):
    state = {"w": torch.ones(8)}
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        h1 = ck.save(7, state)
        state["w"].fill_(2)
        h2 = ck.save(7, state)
        h2.wait(timeout=120)
        h1.wait(timeout=120)  # completes (it committed first, then was superseded): never a hang
        step, w = _restore_w(ck, step=7)
        assert step == 7 and torch.equal(w, torch.full((8,), 2.0))
    # The superseded save's data files are gone; the manifest lists the later save's.
    with open(os.path.join(root, "step-00000007", "manifest.json")) as f:
        manifest = json.load(f)
    data = sorted(n for n in os.listdir(os.path.join(root, "step-00000007")) if n.endswith(".distcp"))
    assert data == sorted(manifest["files"]) and manifest["save_id"] == h2.save_id
    capsys.readouterr()
    assert cli(["verify", root]) == 0


def test_maybe_save_then_a_final_save_of_the_same_step(root):
    state = {"w": torch.zeros(8)}
    with ckptio.Checkpointer(root, every_steps=5) as ck:
        for step in range(1, 11):
            state["w"].fill_(step)
            ck.maybe_save(step, state)
        state["w"].fill_(100)  # the loop's last step changed the state once more
        final = ck.save(10, state)
    assert final.done() and final.error is None
    with ckptio.Checkpointer(root) as ck:
        step, w = _restore_w(ck)
    assert step == 10 and torch.equal(w, torch.full((8,), 100.0))


def _trajectory(root: str, steps: list[int], value: float, *, restore_from: int | None = None) -> None:
    with ckptio.Checkpointer(root, keep_last=0) as ck:
        if restore_from is not None:
            step, w = _restore_w(ck, step=restore_from)
            assert step == restore_from and torch.equal(w, torch.full((8,), float(restore_from)))
        for s in steps:
            ck.save(s, {"w": torch.full((8,), value + s)})


def test_rollback_retires_the_abandoned_trajectory(root, capsys):
    _trajectory(root, [5, 10, 15, 20, 25], 0.0)  # the first run; it diverged after 10
    storage = PosixStorage(root)
    assert fmt.read_latest(storage) == 25
    # Resume from 10 and save 15 and 20 again while the old 15, 20 and 25 exist: no error, and close() is quiet.
    _trajectory(root, [15, 20], 1000.0, restore_from=10)
    assert fmt.committed_steps(storage) == [5, 10, 15, 20]
    assert fmt.read_latest(storage) == 20
    with ckptio.Checkpointer(root) as ck:
        assert ck.latest_step() == 20
        step, w = _restore_w(ck)
        assert step == 20 and torch.equal(w, torch.full((8,), 1020.0))
        step, w = _restore_w(ck, step=15)
        assert torch.equal(w, torch.full((8,), 1015.0))
    capsys.readouterr()
    assert cli(["ls", root, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["steps"]
    assert [(r["step"], r["latest"]) for r in rows if r["committed"]] == [(5, False), (10, False), (15, False),
                                                                          (20, True)]
    assert not [n for n in os.listdir(root) if n == "step-00000025"]
    assert cli(["verify", root]) == 0


def test_a_save_below_the_newest_committed_step_is_never_deleted_by_retention(root):
    # A throttled store keeps step 5 in flight while step 10 commits and runs retention (keep_last=1 would delete
    # every uncommitted directory below 10).
    slow = ThrottledStorage(PosixStorage(root), write_bytes_per_s=4 << 20)
    with ckptio.Checkpointer(slow, keep_last=1, file_size_bytes=1 << 20) as ck:
        ck.save(10, {"w": torch.full((8,), 10.0)})
        h5 = ck.save(5, {"w": torch.full((512, 1024), 5.0)})  # 2 MiB: half a second of writes
        h5.wait(timeout=120)
    with ckptio.Checkpointer(root) as ck:
        target = {"w": torch.zeros(512, 1024)}
        assert ck.restore(target, step=5) == 5
        assert torch.equal(target["w"], torch.full((512, 1024), 5.0))
        assert ck.latest_step() == 10


def test_a_step_committed_by_an_earlier_run_is_never_replaced_without_a_restore(root):
    _trajectory(root, [3], 0.0)
    with ckptio.Checkpointer(root) as ck:
        h = ck.save(3, {"w": torch.full((8,), -1.0)})  # no restore below 3: this run does not own step 3
        with pytest.raises(CommitError, match="already committed"):
            h.wait(timeout=120)
        step, w = _restore_w(ck)
    assert step == 3 and torch.equal(w, torch.full((8,), 3.0))
