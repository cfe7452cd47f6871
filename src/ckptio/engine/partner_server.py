"""The partner server of one writer process, and its client: node-local shard copies over plain TCP (issue 10).

Each writer serves, on a listening socket the trainer bound at construction (inherited by fd, so its address is
stable across writer restarts), two requests:

- ``put``: a partner rank's data file of a local-level step, stored in this node's ``local_dir`` under
  ``partners/step-XXXXXXXX/<name>`` after its crc32c checks out; the answer is the acknowledgement the sender's
  local level waits for.
- ``get``: a data file of a step from this node's local dir (own area first, then the partner area), for a
  restore on another node. The reader verifies the bytes against the local manifest again.

Frames: a 4-byte big-endian length, a JSON header, then ``size`` raw bytes. Names are checked as plain file names
and steps as integers: a request can read or write only inside this node's step and partner directories.
This module never touches a process group, a staging slot, or the durable tier.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
from typing import Any

import crc32c

from ckptio.errors import CkptError, CorruptCheckpointError, NotFoundError, ReplicationError, StorageError
from ckptio.format.keys import check_file_name
from ckptio.format.local_level import own_copy_key, partner_copy_key
from ckptio.storage.base import Storage
from ckptio.storage.posix import TMP_PREFIX

log = logging.getLogger("ckptio")
_CHUNK = 4 << 20
_HEADER = struct.Struct(">I")
_MAX_HEADER = 1 << 16


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, _CHUNK))
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return bytes(buf)


def send_header(sock: socket.socket, header: dict[str, Any]) -> None:
    raw = json.dumps(header).encode()
    sock.sendall(_HEADER.pack(len(raw)) + raw)


def recv_header(sock: socket.socket) -> dict[str, Any]:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if n > _MAX_HEADER:
        raise ConnectionError(f"header of {n} bytes refused")
    header = json.loads(_recv_exact(sock, n))
    if not isinstance(header, dict):
        raise ConnectionError("malformed header")
    return header


def _checked(header: dict[str, Any]) -> tuple[int, str]:
    step, name = header.get("step"), header.get("name")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(name, str):
        raise CorruptCheckpointError("partner request: bad step or name")
    check_file_name(name, step=step)
    return step, name


class PartnerServer:
    """Accepts partner connections on ``listener``; one short-lived thread per connection."""

    def __init__(self, listener: socket.socket, local: Storage, *, timeout_s: float) -> None:
        self.listener, self.local, self.timeout_s = listener, local, timeout_s
        self._stop = False
        self._thread = threading.Thread(target=self._accept_loop, name="ckptio-partner", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), name="ckptio-partner-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self.timeout_s)
        with conn:
            try:
                while True:
                    try:
                        header = recv_header(conn)
                    except ConnectionError:
                        return
                    try:
                        if header.get("op") == "put":
                            self._put(conn, header)
                        elif header.get("op") == "get":
                            self._get(conn, header)
                        else:
                            raise CorruptCheckpointError("partner request: unknown op")
                    except (CorruptCheckpointError, KeyError, TypeError, ValueError) as exc:
                        send_header(conn, {"ok": False, "error": f"refused: {exc}"})
                        return
            except (OSError, ValueError, CkptError) as exc:
                # A broken or hostile connection ends here; the sender sees no acknowledgement.
                log.debug("ckptio partner server: connection dropped: %s", exc)

    def _put(self, conn: socket.socket, header: dict[str, Any]) -> None:
        step, name = _checked(header)
        size, expected = int(header["size"]), str(header["crc32c"])
        key = partner_copy_key(step, name)
        if self.local.is_posix:
            path = self.local.local_path(key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # Listings skip the storage's temp prefix: a half-received copy is never taken for a file.
            tmp = os.path.join(os.path.dirname(path), f"{TMP_PREFIX}{name}-{threading.get_ident()}")
            value = 0
            with open(tmp, "wb") as f:
                left = size
                while left:
                    chunk = _recv_exact(conn, min(left, _CHUNK))
                    value = crc32c.crc32c(chunk, value)
                    f.write(chunk)
                    left -= len(chunk)
            ok = f"{value:08x}" == expected
            if ok:
                os.replace(tmp, path)
            else:
                os.unlink(tmp)
        else:
            data = _recv_exact(conn, size)
            ok = f"{crc32c.crc32c(data):08x}" == expected
            if ok:
                self.local.put(key, data)
        send_header(conn, {"ok": ok, "error": "" if ok else "checksum mismatch on arrival"})

    def _get(self, conn: socket.socket, header: dict[str, Any]) -> None:
        step, name = _checked(header)
        for key in (own_copy_key(step, name), partner_copy_key(step, name)):
            try:
                data = self.local.get(key)
            except (NotFoundError, StorageError):
                continue
            send_header(conn, {"ok": True, "size": len(data)})
            conn.sendall(data)
            return
        send_header(conn, {"ok": False, "size": 0, "error": "not held here"})

    def close(self) -> None:
        """Stop serving. Never ``shutdown()`` the listener: the trainer holds the same socket for the next writer;
        the accept thread is a daemon and ends with this process."""
        self._stop = True
        with contextlib.suppress(OSError):
            self.listener.close()


def send_files(host: str, port: int, step: int, files: list[tuple[str, str, int, str]], *,
               timeout_s: float, who: str) -> None:
    """Copy ``files`` ((name, local path or "", size, crc32c)) to a partner; raise ReplicationError unless every
    one is acknowledged within ``timeout_s`` per operation."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            for name, path, size, crc in files:
                send_header(sock, {"op": "put", "step": step, "name": name, "size": size, "crc32c": crc})
                with open(path, "rb") as f:
                    sock.sendfile(f)
                reply = recv_header(sock)
                if not reply.get("ok"):
                    raise ReplicationError(f"partner {who} refused {name}: {reply.get('error')}", step=step)
    except (OSError, ConnectionError, ValueError) as exc:
        raise ReplicationError(f"partner {who} at {host}:{port} unreachable: {type(exc).__name__}: {exc}",
                               step=step) from None


def fetch_file(host: str, port: int, step: int, name: str, *, timeout_s: float) -> bytes:
    """One data file from the partner server at ``host:port``; NotFoundError when it does not hold it."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        send_header(sock, {"op": "get", "step": step, "name": name})
        reply = recv_header(sock)
        if not reply.get("ok"):
            raise NotFoundError(f"{host}:{port} does not hold {name}", step=step)
        return _recv_exact(sock, int(reply["size"]))
