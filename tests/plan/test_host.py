"""Host-side serialize rate: forked writers measured together, none left behind, a silent child is killed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from ckptio.plan.host import _collect, _reap, serialize_bytes_per_s

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
    from ckptio.plan.host import measure_fresh_copy_drag

    state = {"w": torch.arange(1 << 16, dtype=torch.float32), "nested": {"m": [torch.ones(4)], "step": 3}}
    before = {"w": state["w"].clone(), "m": state["nested"]["m"][0].clone()}
    calls = []

    def step() -> None:
        calls.append(1)
        buffers = [torch.empty(1 << 18).fill_(1.0) for _ in range(4)]  # a CPU step's host buffers
        del buffers

    drag = measure_fresh_copy_drag(step, lambda: state, steps=2, repeats=2)
    assert drag >= 0.0 and len(calls) == 12
    assert torch.equal(state["w"], before["w"]) and torch.equal(state["nested"]["m"][0], before["m"])
    with pytest.raises(ConfigError):
        measure_fresh_copy_drag(step, lambda: state, steps=0)
    with pytest.raises(ConfigError):
        measure_fresh_copy_drag(step, lambda: state, repeats=0)


def test_direct_io_collateral_steps_while_any_rank_writes_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """The ``O_DIRECT`` collateral measurement brackets the steps taken during a real ``O_DIRECT`` write (ckptio's
    own path, on the test's disk) with clean ones, keeps stepping while any rank still writes (a peer's write
    stands in as ``any_writing`` answering yes a few more times), and removes its files. Its value is a timing:
    only its range is asserted."""
    from ckptio.errors import ConfigError
    from ckptio.plan.host import measure_direct_io_collateral

    calls: list[int] = []
    peer_writing = [3]

    def any_writing(writing: bool) -> bool:
        peer_writing[0] -= 1
        return writing or peer_writing[0] >= 0

    def step() -> None:
        calls.append(1)
        time.sleep(0.001)

    figure = measure_direct_io_collateral(step, str(tmp_path), 4 * MIB, steps=2, repeats=1, any_writing=any_writing)
    assert figure >= 0.0
    assert len(calls) >= 2 + 3 + 2  # clean, at least the peer's three live steps, clean
    assert list(tmp_path.iterdir()) == []
    for bad in ({"steps": 0}, {"repeats": 0}):
        with pytest.raises(ConfigError):
            measure_direct_io_collateral(step, str(tmp_path), 4 * MIB, **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        measure_direct_io_collateral(step, str(tmp_path), 0)
    with pytest.raises(ConfigError, match="existing directory"):
        measure_direct_io_collateral(step, str(tmp_path / "absent"), 4 * MIB)


def test_the_stand_in_writer_is_a_niced_process_that_writes_its_bytes_on_go(tmp_path: Path) -> None:
    """:mod:`ckptio.plan.io_load` runs as ckptio's writer does (a process of its own at nice 10), writes nothing
    before it is told to go, then writes exactly its bytes and reports its CPU."""
    import json
    import subprocess
    import sys

    target = tmp_path / "load"
    nbytes = 8 * MIB + 12345  # a whole chunk and a tail
    proc = subprocess.Popen([sys.executable, "-m", "ckptio.plan.io_load", str(target), str(nbytes), "10"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        assert not target.exists()
        assert psutil.Process(proc.pid).nice() == min(19, os.nice(0) + 10)
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
        proc.wait()
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["error"] is None and outcome["cpu_s"] >= 0
    if not outcome["unsupported"]:  # a filesystem that refuses O_DIRECT leaves no file
        assert target.stat().st_size == nbytes


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_direct_io_collateral_is_zero_where_the_filesystem_refuses_o_direct() -> None:
    """tmpfs refuses ``O_DIRECT``: ckptio writes buffered there, and its writer's I/O has no ``O_DIRECT`` cost."""
    import tempfile

    from ckptio.plan.host import measure_direct_io_collateral

    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        assert measure_direct_io_collateral(lambda: time.sleep(0.002), shm, 4 * MIB, steps=1, repeats=1) == 0.0
        assert os.listdir(shm) == []
