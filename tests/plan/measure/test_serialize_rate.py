"""Host-side serialize rate: forked writers measured together, none left behind, a silent child is killed."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from ckptio.plan.measure.serialize_rate import _collect, _reap, serialize_bytes_per_s

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
