"""``partner_pace``: partner copies paced chunk by chunk on the writer's flush pacer (issue 19, item 4).

The copies go to a real partner server process over a real socket; the pacer runs on a clock that advances only by
its own waits, so what the pace held back is exact and no test reads a wall clock.
"""

from __future__ import annotations

import secrets
import threading

import pytest

from ckptio.config import CheckpointerConfig
from ckptio.engine.partner import PartnerLimits, file_digest, send_files
from ckptio.engine.partner.client import copy_rate
from ckptio.engine.partner.digest import CHUNK
from ckptio.engine.writer.flush_pacer import FlushPacer
from ckptio.errors import ConfigError
from ckptio.format.local_level_records import partner_copy_key
from tests.engine.test_partner_security import NAME, ServerProc, _file


class FakeClock:
    """Time that moves only when the pacer waits (a hurried wait returns at once)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if not event.is_set():
            self.now += seconds
        return event.is_set()


def test_copy_rate_is_a_share_of_the_node_never_below_the_partner_minimum() -> None:
    limits = PartnerLimits()
    assert copy_rate(None, 2, limits) is None
    assert copy_rate(64e6, 2, limits) == 32e6
    assert copy_rate(64e6, 0, limits) == 64e6  # a node always has this rank
    assert copy_rate(1e6, 4, limits) == limits.min_rate  # slower would miss the partner's deadline


def test_partner_pace_is_validated() -> None:
    assert CheckpointerConfig(root="/tmp/x", partner_pace=50e6).writer_config().partner_pace == 50e6
    with pytest.raises(ConfigError, match="partner_pace"):
        CheckpointerConfig(root="/tmp/x", partner_pace=0)
    with pytest.raises(ConfigError, match="partner_pace"):
        CheckpointerConfig(root="/tmp/x", partner_pace=-1.0)


def _paced_copy(tmp_path, *, hurry: bool):  # type: ignore[no-untyped-def]
    secret = secrets.token_bytes(32)
    server = ServerProc(tmp_path / "node", secret, limits={"handshake_s": 5.0, "idle_s": 10.0})
    try:
        src, crc = _file(tmp_path, size=3 * CHUNK + 5)
        clock = FakeClock()
        pacer = FlushPacer(clock=clock, wait=clock.wait)
        pacer.job_arrived()
        pacer.job_started()
        with pacer.begin(8.0 * CHUNK) as flush:
            if hurry:
                pacer.job_arrived()  # the next save arrived: the copy goes at full speed
            digests = send_files("127.0.0.1", server.port, 7, [(NAME, str(src), src.stat().st_size, crc)],
                                 secret=secret, timeout_s=10, who="t", pacer=flush.pacer)
        assert digests == {NAME: file_digest(str(src))}
        assert (server.local / partner_copy_key(7, NAME)).read_bytes() == src.read_bytes()
        server.close()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    assert flush.report is not None
    return flush.report, src.stat().st_size


def test_a_paced_copy_waits_its_tickets_chunk_by_chunk(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report, size = _paced_copy(tmp_path, hurry=False)
    assert report.bytes == size  # every chunk took a ticket
    assert report.stretched_s == pytest.approx(3 / 8)  # chunks 2, 3 and 4 were due 1/8 s apart
    assert not report.hurried


def test_a_hurried_copy_goes_at_full_speed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report, size = _paced_copy(tmp_path, hurry=True)
    assert report.bytes == size and report.stretched_s == 0.0 and report.hurried
