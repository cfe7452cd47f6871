"""A fault-injecting HTTP proxy for S3 tests: sits on 127.0.0.1 in front of the moto server.

It forwards requests unchanged (SigV4 signatures cover the Host header, which moto does not check) and,
by rule, answers 503 SlowDown / 500 / 409 instead, drops the connection halfway through a request body,
forwards the request and then drops the connection before the client sees the answer (the ambiguous case:
the write happened but the client cannot know), or flips one byte of a request body in flight.

It checks what moto does not: a body that carries ``x-amz-checksum-crc32c`` must match it, or the answer is
S3's 400 BadDigest and nothing is forwarded. So a corrupted body reaches moto only when the client sent no
checksum, and a test can tell the two apart.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlparse

import crc32c

FaultKind = Literal["slowdown", "error500", "conflict409", "drop_request", "drop_response", "truncate_response",
                    "corrupt_body"]

_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "error500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "conflict409": (409, "ConditionalRequestConflict", "A conflicting conditional operation is in progress."),
}
_BAD_DIGEST = (400, "BadDigest", "The CRC32C you specified did not match the calculated checksum.")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "upgrade", "te"}


@dataclass(kw_only=True)
class Fault:
    """Inject ``kind`` on every ``every``-th request matching ``method`` and the path/query filters."""

    kind: FaultKind
    """What to do instead of (or after) forwarding."""
    every: int = 1
    """1 hits every matching request, 3 every third one."""
    method: str = "PUT"
    """PUT covers PutObject and UploadPart; POST covers Create/CompleteMultipartUpload."""
    query_contains: str = ""
    """Only requests whose query string contains this (``uploadId=``, ``partNumber=2``)."""
    path_contains: str = ""
    """Only requests whose path contains this (a key name)."""
    limit: int | None = None
    """Stop injecting after this many faults (None: never stop)."""
    seen: int = 0
    """Matching requests seen so far."""
    injected: int = 0
    """Faults injected so far."""


class FaultProxy:
    """``FaultProxy(upstream_url)``: ``.url`` is the endpoint for clients, ``.add(Fault(...))`` a rule."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def choose(self, method: str, path: str) -> FaultKind | None:
        """The fault to inject for this request, counting it against every matching rule."""
        _, _, query = path.partition("?")
        with self._lock:
            self.requests.append((method, path))
            for fault in self.faults:
                if fault.method != method or fault.query_contains not in query:
                    continue
                if fault.path_contains not in path.partition("?")[0]:
                    continue
                if fault.limit is not None and fault.injected >= fault.limit:
                    continue
                fault.seen += 1
                if fault.seen % fault.every == 0:
                    fault.injected += 1
                    return fault.kind
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and 100-continue for large bodies as botocore expects

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _relay(self) -> None:
            kind = proxy.choose(self.command, self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if kind == "drop_request":
                self.rfile.read(length // 2)
                self._drop()
                return
            body = self.rfile.read(length) if length else b""
            if kind in _ERRORS:
                self._answer_error(*_ERRORS[kind])
                return
            if kind == "corrupt_body" and body:
                body = body[:-1] + bytes([body[-1] ^ 0x01])
            sent = self.headers.get("x-amz-checksum-crc32c")
            if sent is not None and sent != base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode():
                self._answer_error(*_BAD_DIGEST)
                return
            status, headers, payload = self._forward(body)
            if kind == "drop_response":
                self._drop()
                return
            if kind == "truncate_response":  # the whole answer announced, half of its body sent, then a reset
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self._drop()
                return
            self.send_response(status)
            head = self.command == "HEAD"  # a HEAD answer keeps the object's Content-Length, with no body
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP and (head or name.lower() != "content-length"):
                    self.send_header(name, value)
            if not head:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if not head:
                self.wfile.write(payload)

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.getheaders(), resp.read()
            finally:
                conn.close()

        def _answer_error(self, status: int, code: str, message: str) -> None:
            payload = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _drop(self) -> None:
            # RST instead of FIN, like a dying load balancer: the client sees a reset, not a clean close.
            self.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            self.close_connection = True
            self.connection.close()

        def finish(self) -> None:
            with contextlib.suppress(OSError):  # the socket was dropped on purpose
                super().finish()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

    return Handler
