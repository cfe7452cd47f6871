"""The partner channel against a hostile network (issue 16): a real server process, real sockets.

The server runs in a process of its own (tests/engine/partner_server_proc.py) so that its memory and descriptor
limit are measured and lowered alone; the attacker is this test process. The end-to-end cases — a plain client
against a real writer, forged copies at restore — are in test_two_levels.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

from ckptio.engine.partner import PartnerLimits, fetch_verified, file_digest, send_files
from ckptio.engine.partner.auth import MAGIC, Channel, connect, recv_exact, send_all
from ckptio.errors import ChecksumError, NotFoundError, ReplicationError
from ckptio.format.local_level_records import partner_copy_key
from tests.engine.forge import forge_floats

PROC = os.path.join(os.path.dirname(__file__), "partner_server_proc.py")
NAME = "__1_0-9.distcp"


class ServerProc:
    """One partner server process; ``stats()`` asks it for its counters, RSS and open descriptors."""

    def __init__(self, local: Path, secret: bytes, **spec: Any) -> None:
        self.local = local
        self.proc = subprocess.Popen([sys.executable, PROC, json.dumps({"local": str(local), **spec})],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._say(secret.hex())
        hello = self._read()
        self.port, self.pid = hello["port"], hello["pid"]

    def _say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"server process exited ({self.proc.wait()})"
        return dict(json.loads(line))

    def stats(self) -> dict[str, Any]:
        self._say("stats")
        return self._read()

    def close(self, keep_steps: list[int] | None = None) -> None:
        if self.proc.poll() is None:
            self._say("close " + " ".join(str(s) for s in keep_steps or []))
            assert self._read() == {"closed": True}
        assert self.proc.wait(timeout=30) == 0
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def secret() -> bytes:
    return secrets.token_bytes(32)


@pytest.fixture
def server(tmp_path: Path, secret: bytes) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path / "node", secret, limits={"handshake_s": 1.0, "idle_s": 5.0})
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


def _file(tmp_path: Path, size: int = 300_000) -> tuple[Path, str]:
    src = tmp_path / "f"
    src.write_bytes(os.urandom(size))
    return src, f"{crc32c.crc32c(src.read_bytes()):08x}"


def _eventually(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
    return result


def _temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".tmp-*")) if directory.exists() else []


def test_copies_cross_only_between_holders_of_the_secret(server, secret, tmp_path):
    src, crc = _file(tmp_path)
    digests = send_files("127.0.0.1", server.port, 3, [(NAME, str(src), src.stat().st_size, crc)], secret=secret,
                         timeout_s=10, who="t")
    assert digests == {NAME: file_digest(str(src))}
    assert (server.local / partner_copy_key(3, NAME)).read_bytes() == src.read_bytes()
    dest = tmp_path / "fetched"
    fetch_verified("127.0.0.1", server.port, 3, NAME, str(dest), expected_digest=digests[NAME],
                   expected_size=src.stat().st_size, secret=secret, timeout_s=10)
    assert dest.read_bytes() == src.read_bytes()
    with pytest.raises(NotFoundError):
        fetch_verified("127.0.0.1", server.port, 4, NAME, str(dest), expected_digest=digests[NAME],
                       expected_size=src.stat().st_size, secret=secret, timeout_s=10)

    other = secrets.token_bytes(32)  # another job's secret: no put, no get
    with pytest.raises(ReplicationError, match="not authenticated"):
        send_files("127.0.0.1", server.port, 5, [(NAME, str(src), src.stat().st_size, crc)], secret=other,
                   timeout_s=10, who="t")
    with pytest.raises(ReplicationError):
        fetch_verified("127.0.0.1", server.port, 3, NAME, str(tmp_path / "x"), expected_digest=digests[NAME],
                       expected_size=src.stat().st_size, secret=other, timeout_s=10)
    assert not (server.local / partner_copy_key(5, NAME)).exists() and not (tmp_path / "x").exists()
    # A fetched copy that is not the recorded one is refused and not kept.
    with pytest.raises(ChecksumError, match="does not match the recorded"):
        fetch_verified("127.0.0.1", server.port, 3, NAME, str(tmp_path / "y"), expected_digest="sha256:" + "0" * 64,
                       expected_size=src.stat().st_size, secret=secret, timeout_s=10)
    assert not (tmp_path / "y").exists() and _temps(tmp_path) == []
    assert server.stats()["unauthenticated"] == 2
    server.close()


def _drain(sock: socket.socket) -> bytes:
    """Everything the server sends until it hangs up (a reset counts as hanging up)."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 16):
            received += chunk
    return received


@pytest.mark.parametrize("probe", ["old-protocol get", "old-protocol put", "magic, wrong proof", "silence"])
def test_a_plain_client_gets_nothing(server, secret, tmp_path, probe):
    src, crc = _file(tmp_path)
    send_files("127.0.0.1", server.port, 3, [(NAME, str(src), src.stat().st_size, crc)], secret=secret,
               timeout_s=10, who="t")
    get = json.dumps({"op": "get", "step": 3, "name": NAME}).encode()
    put = json.dumps({"op": "put", "step": 4, "name": NAME, "size": src.stat().st_size, "crc32c": crc}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            if probe == "old-protocol get":
                sock.sendall(len(get).to_bytes(4, "big") + get)
            elif probe == "old-protocol put":
                sock.sendall(len(put).to_bytes(4, "big") + put + src.read_bytes())
            elif probe == "magic, wrong proof":
                sock.sendall(MAGIC + os.urandom(32))
                sock.sendall(os.urandom(32) + len(get).to_bytes(4, "big") + get)
        received = _drain(sock)  # the server hangs up within its handshake deadline (1 s here)
    if probe == "magic, wrong proof":
        assert len(received) == 32  # the server's nonce: no header, no byte of any file
    else:
        assert received == b""
    assert not (server.local / partner_copy_key(4, NAME)).exists()
    stats = server.stats()
    assert stats["unauthenticated"] == 1 and stats["get"] == 0 and stats["put"] == 1, stats
    server.close(keep_steps=[3])


def test_a_copy_altered_in_transit_with_a_fixed_crc_is_refused(server, secret, tmp_path):
    # What a man in the middle can do without the secret: change the bytes between the MAC'd headers, keeping
    # size and crc32c. The digest in the MAC'd put-end header was computed from the real bytes.
    src, crc = _file(tmp_path)
    data = src.read_bytes()
    forged = forge_floats(data, 0)
    channel = connect("127.0.0.1", server.port, secret, timeout_s=10)
    with channel.sock:
        deadline = time.monotonic() + 10
        channel.send_header({"op": "put", "step": 3, "name": NAME, "size": len(data), "crc32c": crc}, deadline)
        send_all(channel.sock, forged, deadline)
        channel.send_header({"op": "put-end", "digest": file_digest(str(src))}, deadline)
        reply = channel.recv_header(deadline)
    assert reply["ok"] is False and "digest mismatch" in reply["error"], reply
    assert not (server.local / partner_copy_key(3, NAME)).exists() and _temps(server.local) == []
    assert server.stats()["put_refused"] == 1
    server.close()


def _frame(sock: socket.socket) -> bytes:
    """One raw MAC'd header frame as it crosses the wire (length, JSON, tag)."""
    prefix = recv_exact(sock, 4, time.monotonic() + 5)
    return prefix + recv_exact(sock, int.from_bytes(prefix, "big") + 32, time.monotonic() + 5)


@pytest.mark.parametrize("attack", ["altered", "replayed", "reflected"])
def test_a_header_altered_replayed_or_reflected_in_transit_is_refused(attack):
    # A man in the middle between two channels that share a session key: it relays frames, and changes one.
    key = secrets.token_bytes(32)
    client_end, wire_in = socket.socketpair()
    wire_out, server_end = socket.socketpair()
    with client_end, wire_in, wire_out, server_end:
        client, server = Channel(client_end, key, is_server=False), Channel(server_end, key, is_server=True)
        client.send_header({"op": "get", "step": 3, "name": NAME}, time.monotonic() + 5)
        first = _frame(wire_in)
        wire_out.sendall(first)
        assert server.recv_header(time.monotonic() + 5)["step"] == 3  # relayed unchanged: accepted
        client.send_header({"op": "get", "step": 3, "name": NAME}, time.monotonic() + 5)
        second = _frame(wire_in)
        if attack == "altered":
            forged = second.replace(b'"step":3', b'"step":4')
            assert forged != second
        elif attack == "replayed":
            forged = first
        else:  # the server's own answer sent back to it as if from the client
            server.send_header({"ok": True, "size": 0}, time.monotonic() + 5)
            forged = _frame(wire_out)
        wire_out.sendall(forged)
        with pytest.raises(ReplicationError, match="MAC"):
            server.recv_header(time.monotonic() + 5)


def _raise_nofile(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"needs {want} descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def test_eleven_hundred_idle_connections_do_not_stop_the_server(tmp_path, secret):
    _raise_nofile(1400)
    # The server's soft descriptor limit (64) is below its connection limit (128): accept() runs into EMFILE,
    # as a writer with a low limit would under a flood.
    server = ServerProc(tmp_path / "node", secret, nofile=64,
                        limits={"handshake_s": 1.0, "idle_s": 5.0, "max_connections": 128})
    idle: list[socket.socket] = []
    try:
        for _ in range(1100):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", server.port))  # connected or in progress: either way, it says nothing
            idle.append(s)
        # EMFILE was hit, and the loop went on (the stats answer itself may need a descriptor: retried).
        _eventually(lambda: server.stats()["accept_backoff"] > 0)
        time.sleep(1.5)  # past the handshake deadline: the server has dropped the idle ones it took
    finally:
        for s in idle:
            s.close()
    _eventually(lambda: (server.stats()["fds"] or 999) < 32)
    src, crc = _file(tmp_path)
    digests = send_files("127.0.0.1", server.port, 3, [(NAME, str(src), src.stat().st_size, crc)], secret=secret,
                         timeout_s=20, who="t")
    dest = tmp_path / "back"
    fetch_verified("127.0.0.1", server.port, 3, NAME, str(dest), expected_digest=digests[NAME],
                   expected_size=src.stat().st_size, secret=secret, timeout_s=20)
    assert dest.read_bytes() == src.read_bytes()
    stats = server.stats()
    assert stats["put"] == 1 and stats["get"] == 1 and stats["unauthenticated"] > 0, stats
    server.close()


UNREAD_GETS = 40
FILE_MIB = 8
RSS_BOUND_MIB = 16  # a file held in memory per request (the server before issue 16) adds > 40 * 8 MiB


def test_unread_gets_do_not_grow_the_server(server, secret, tmp_path):
    src, crc = _file(tmp_path, FILE_MIB << 20)
    send_files("127.0.0.1", server.port, 3, [(NAME, str(src), src.stat().st_size, crc)], secret=secret,
               timeout_s=20, who="t")
    before = server.stats()["rss"]
    readers = []
    try:
        for _ in range(UNREAD_GETS):
            channel = connect("127.0.0.1", server.port, secret, timeout_s=10)
            channel.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            channel.send_header({"op": "get", "step": 3, "name": NAME}, time.monotonic() + 10)
            readers.append(channel.sock)  # never read from
        time.sleep(1.0)  # every server thread is now blocked on a full socket
        during = server.stats()
        assert during["fds"] >= 2 * UNREAD_GETS, during  # every get is being served: its socket and its file open
        grown = (during["rss"] - before) / (1 << 20)
        assert grown < RSS_BOUND_MIB, f"server RSS grew {grown:.1f} MiB with {UNREAD_GETS} unread gets"
    finally:
        for s in readers:
            s.close()
    server.close(keep_steps=[3])


def test_aborted_and_abandoned_puts_leave_nothing(server, secret, tmp_path):
    src, crc = _file(tmp_path, 2 << 20)
    step_dir = server.local / "partners" / "step-00000003"
    channel = connect("127.0.0.1", server.port, secret, timeout_s=10)
    with channel.sock:
        channel.send_header({"op": "put", "step": 3, "name": NAME, "size": 2 << 20, "crc32c": crc},
                            time.monotonic() + 10)
        send_all(channel.sock, src.read_bytes()[: 1 << 20], time.monotonic() + 10)
        _eventually(lambda: _temps(step_dir))  # the half-received copy exists...
    _eventually(lambda: not _temps(step_dir))  # ...and is gone once the sender hung up
    assert not (step_dir / NAME).exists()

    # A writer killed mid-transfer cannot clean up: its temp file goes at the next successful put once stale.
    step_dir.mkdir(parents=True, exist_ok=True)
    stale = step_dir / ".tmp-p999999-deadbeef-__0_0-1.distcp"
    stale.write_bytes(b"x" * 100)
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    fresh = step_dir / ".tmp-p999999-cafef00d-__0_0-2.distcp"  # another live writer's transfer: kept
    fresh.write_bytes(b"y")
    send_files("127.0.0.1", server.port, 3, [(NAME, str(src), 2 << 20, crc)], secret=secret, timeout_s=10, who="t")
    send_files("127.0.0.1", server.port, 7, [(NAME, str(src), 2 << 20, crc)], secret=secret, timeout_s=10, who="t")
    assert _temps(step_dir) == [fresh.name] and (step_dir / NAME).exists()
    # close(): copies this server received for steps that did not commit (7) go; committed ones (3) stay.
    server.close(keep_steps=[3])
    assert (step_dir / NAME).exists()
    assert not (server.local / "partners" / "step-00000007").exists()


def test_limits_are_checked():
    with pytest.raises(ValueError):
        PartnerLimits(max_connections=0)
    with pytest.raises(ValueError):
        PartnerLimits(idle_s=0)
    assert PartnerLimits.for_timeout(2.0).handshake_s == 2.0


def test_a_short_secret_is_refused(tmp_path):
    from ckptio.engine.partner import PartnerServer
    from ckptio.errors import ConfigError
    from ckptio.storage import open_storage

    with socket.create_server(("127.0.0.1", 0)) as listener, pytest.raises(ConfigError):
        PartnerServer(listener, open_storage(str(tmp_path)), secret=b"short")
