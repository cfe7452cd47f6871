"""The job's partner secret and the authenticated channel every partner connection runs on.

The secret: rank 0 draws 32 bytes with :mod:`secrets` at construction and broadcasts them over ckptio's side
group (:func:`agree_secret`); each trainer hands them to its writer inside ``LevelsStart`` over the trainer→writer
pipe. They are never written to disk or to an environment variable, and they only authenticate connections (no
stored byte depends on them), so a new run simply draws a new one.

The handshake (both sides prove the secret with fresh nonces; the secret itself never crosses the wire)::

    client → server   MAGIC, Nc (32 random bytes)
    server → client   Ns (32 random bytes)
    client → server   HMAC(secret, "client" | Nc | Ns)       the server checks it before it sends anything else
    server → client   HMAC(secret, "server" | Nc | Ns)       the client checks it: it talks to the job's server
    both              K = HMAC(secret, "session" | Nc | Ns)

The client proves itself first, so an unauthenticated peer learns nothing but a random nonce. After the
handshake every header is a frame ``length | JSON | HMAC(K, direction | sequence | length | JSON)``: a header
cannot be forged, altered, replayed, reordered or reflected without the failure closing the connection. Raw file
bytes between headers are not MAC'd one by one: the digest that covers them travels in a MAC'd header (put) or
sits in the durable record (get), and the receiver checks it before it keeps the bytes.

Every read here runs against a deadline (a peer that sends one byte a minute still ends on time). No files here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

from ckptio.errors import ReplicationError

if TYPE_CHECKING:
    from ckptio.engine.side_group import SideGroup

MAGIC = b"ckptio-partner/2"
SECRET_BYTES = 32
NONCE_BYTES = 32
TAG_BYTES = 32
MAX_HEADER = 1 << 16
_LEN = struct.Struct(">I")


def agree_secret(group: SideGroup) -> bytes:
    """Every rank together: rank 0 draws the job's partner secret, every rank returns the same bytes."""
    secret = secrets.token_bytes(SECRET_BYTES) if group.rank == 0 else None
    agreed = group.broadcast_from_rank0(secret)
    if not isinstance(agreed, bytes) or len(agreed) != SECRET_BYTES:
        raise ReplicationError("partner secret: rank 0 sent no usable secret", rank=group.rank)
    return agreed


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int, deadline: float, *, idle_s: float | None = None,
               into: memoryview | None = None) -> bytes:
    """Exactly ``n`` bytes before the monotonic ``deadline`` (and, with ``idle_s``, no gap longer than that).
    With ``into`` (at least ``n`` long) the bytes land there and b"" is returned: no allocation per chunk."""
    view = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"deadline passed with {n - got} of {n} bytes outstanding")
        sock.settimeout(min(left, idle_s) if idle_s is not None else left)
        k = sock.recv_into(view[got:n], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return b"" if into is not None else bytes(view)


def send_all(sock: socket.socket, data: bytes | memoryview, deadline: float, *, idle_s: float | None = None) -> None:
    """``sendall`` that ends by ``deadline``: a peer that stops reading cannot hold the sender longer."""
    view, sent = memoryview(data), 0
    while sent < len(view):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed while sending")
        sock.settimeout(min(left, idle_s) if idle_s is not None else left)
        sent += sock.send(view[sent:])


class Channel:
    """One authenticated connection: MAC'd, sequenced headers both ways over ``sock``."""

    def __init__(self, sock: socket.socket, key: bytes, *, is_server: bool) -> None:
        self.sock, self._key = sock, key
        self._out_label, self._in_label = (b"s2c", b"c2s") if is_server else (b"c2s", b"s2c")
        self._sent = self._received = 0

    def send_header(self, header: dict[str, Any], deadline: float) -> None:
        raw = json.dumps(header, separators=(",", ":")).encode()
        prefix = _LEN.pack(len(raw))
        tag = _mac(self._key, self._out_label, self._sent.to_bytes(8, "big"), prefix, raw)
        self._sent += 1
        send_all(self.sock, prefix + raw + tag, deadline)

    def recv_header(self, deadline: float) -> dict[str, Any]:
        prefix = recv_exact(self.sock, _LEN.size, deadline)
        (n,) = _LEN.unpack(prefix)
        if n > MAX_HEADER:
            raise ReplicationError(f"header of {n} bytes refused")
        raw = recv_exact(self.sock, n, deadline)
        tag = recv_exact(self.sock, TAG_BYTES, deadline)
        expected = _mac(self._key, self._in_label, self._received.to_bytes(8, "big"), prefix, raw)
        if not hmac.compare_digest(tag, expected):
            raise ReplicationError("header MAC mismatch")
        self._received += 1
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ReplicationError("malformed header")
        return header


def server_handshake(sock: socket.socket, secret: bytes, deadline: float) -> Channel:
    """The server side; ReplicationError (or OSError/TimeoutError) unless the peer proves the secret by ``deadline``."""
    hello = recv_exact(sock, len(MAGIC) + NONCE_BYTES, deadline)
    if not hmac.compare_digest(hello[:len(MAGIC)], MAGIC):
        raise ReplicationError("not a ckptio partner client")
    nc, ns = hello[len(MAGIC):], secrets.token_bytes(NONCE_BYTES)
    send_all(sock, ns, deadline)
    proof = recv_exact(sock, TAG_BYTES, deadline)
    if not hmac.compare_digest(proof, _mac(secret, b"client", nc, ns)):
        raise ReplicationError("client proof mismatch")
    send_all(sock, _mac(secret, b"server", nc, ns), deadline)
    return Channel(sock, _mac(secret, b"session", nc, ns), is_server=True)


def client_handshake(sock: socket.socket, secret: bytes, deadline: float) -> Channel:
    """The client side; ReplicationError unless the server proves the same secret by ``deadline``."""
    nc = secrets.token_bytes(NONCE_BYTES)
    send_all(sock, MAGIC + nc, deadline)
    try:
        ns = recv_exact(sock, NONCE_BYTES, deadline)
        send_all(sock, _mac(secret, b"client", nc, ns), deadline)
        proof = recv_exact(sock, TAG_BYTES, deadline)
    except ConnectionError as exc:
        raise ReplicationError(f"the partner server closed the handshake (not this job's secret?): {exc}") from None
    if not hmac.compare_digest(proof, _mac(secret, b"server", nc, ns)):
        raise ReplicationError("the partner server did not prove this job's secret")
    return Channel(sock, _mac(secret, b"session", nc, ns), is_server=False)


def connect(host: str, port: int, secret: bytes, *, timeout_s: float) -> Channel:
    """An authenticated channel to ``host:port`` within ``timeout_s`` (the caller closes ``channel.sock``)."""
    deadline = time.monotonic() + timeout_s
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        return client_handshake(sock, secret, deadline)
    except BaseException:
        sock.close()
        raise
