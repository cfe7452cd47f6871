"""The partner server of one writer process: takes partner copies (``put``) and serves files (``get``) to peers
that prove the job's secret.

It serves on a listening socket the trainer bound at construction to the address the job advertises (inherited
by fd, so its address is stable across writer restarts). Each connection first runs the handshake of
:mod:`~ckptio.engine.partner.auth` within ``handshake_s``; a peer that fails it is closed having received one
random nonce and nothing else. Then, over MAC'd headers:

- ``put`` (header: step, name, size, crc32c; then ``size`` raw bytes; then a ``put-end`` header with the
  sender's digest): stored as ``partners/step-XXXXXXXX/<name>`` in this node's ``local_dir`` only when the bytes
  received match both the crc32c and the digest; the answer is the acknowledgement the sender's local level waits
  for.
- ``get`` (header: step, name): the file from this node's own area, else its partner area, streamed with
  ``sendfile``. The client checks it against the digest in the durable record before it keeps a byte.

Resources are bounded (:class:`~ckptio.engine.partner.limits.PartnerLimits`): at most ``max_connections``
threads, each with a handshake, idle and per-transfer deadline, one chunk buffer per ``put`` and none per ``get``.
The accept loop survives EMFILE/ENFILE/ENOBUFS/ENOMEM (backs off) and ECONNABORTED/EPROTO (goes on); only
``close()`` ends it.

Leftovers: an aborted ``put`` deletes its temporary file at once; a successful ``put`` also removes temporary
files nobody wrote to for ``stale_s`` (a writer killed mid-transfer), and ``close()`` removes this process's
remaining temporary files. The copies themselves are never deleted here: the writer's local tier owns every
deletion of a kept file in ``local_dir`` (``received()`` tells it which copies this server took). This module
never touches a process group, a staging slot or the durable tier.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from collections import Counter
from typing import Any

from ckptio.engine.partner.auth import Channel, server_handshake
from ckptio.engine.partner.digest import digests_equal
from ckptio.engine.partner.files import receive_to_file, remove_abandoned_temps, send_file
from ckptio.engine.partner.limits import PartnerLimits
from ckptio.errors import CkptError, ConfigError, CorruptCheckpointError
from ckptio.format.keys import check_file_name, parse_step_dir
from ckptio.format.local_level_records import PARTNERS_DIR, own_copy_key, partner_copy_key
from ckptio.storage.base import Storage

log = logging.getLogger("ckptio")

# accept() failures that mean "out of a resource for now": wait and try again, never stop serving.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() failures that mean the listener itself is gone: only close() may cause them.
_FATAL_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK, errno.EINVAL})
_MAX_BACKOFF_S = 1.0


def _checked(header: dict[str, Any]) -> tuple[int, str]:
    step, name = header.get("step"), header.get("name")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(name, str):
        raise CorruptCheckpointError("partner request: bad step or name")
    check_file_name(name, step=step)
    return step, name


def _size_and_crc(header: dict[str, Any]) -> tuple[int, str]:
    size, crc = header.get("size"), header.get("crc32c")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(crc, str):
        raise CorruptCheckpointError("partner put: bad size or crc32c")
    return size, crc


class PartnerServer:
    """Serves authenticated partner connections on ``listener``; one bounded thread per connection."""

    def __init__(self, listener: socket.socket, local: Storage, *, secret: bytes,
                 limits: PartnerLimits | None = None) -> None:
        directory = local.local_directory()
        if directory is None:
            raise ConfigError("the partner server needs a POSIX local_dir")
        if len(secret) < 16:
            raise ConfigError("the partner secret must be at least 16 bytes")
        self.listener, self.local, self.limits = listener, local, limits or PartnerLimits()
        self.directory = directory  # the kernel's side of the local tier: receives and sends are file descriptors
        self._secret = secret
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._temps: set[str] = set()
        self._received: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self.stats: Counter[str] = Counter()
        """accepted, busy (closed: no free slot), unauthenticated, accept_backoff, put, put_refused, get."""
        listener.setblocking(False)  # poll() then accept(): close() is noticed within one poll interval
        self._thread = threading.Thread(target=self._accept_loop, name="ckptio-partner", daemon=True)
        self._thread.start()

    def _count(self, what: str) -> None:
        with self._lock:  # connection threads count at once; a lost increment would make the counters lie
            self.stats[what] += 1

    # ---- accepting -------------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        poller = select.poll()  # not select(): the listener's fd may be above FD_SETSIZE
        poller.register(self.listener.fileno(), select.POLLIN)
        backoff = 0.0
        while not self._stop.is_set():
            if backoff and self._stop.wait(backoff):
                return
            try:
                if not poller.poll(200):
                    continue
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                continue  # another waiter took it, or the peer reset before we got to it
            except OSError as exc:
                if self._stop.is_set() or exc.errno in _FATAL_ERRNOS:
                    if not self._stop.is_set():
                        log.error("ckptio partner server: listener unusable, no longer serving: %s", exc)
                    return
                if exc.errno in _RESOURCE_ERRNOS:
                    # Out of descriptors or buffers: connections wait in the backlog until ours end (deadlines).
                    backoff = min(max(2 * backoff, 0.05), _MAX_BACKOFF_S)
                    self._count("accept_backoff")
                    log.warning("ckptio partner server: accept failed (%s); retrying in %.2f s", exc, backoff)
                continue  # ECONNABORTED, EPROTO, ...: that one connection is gone, the next is fine
            backoff = 0.0 if self._admit(conn) else _MAX_BACKOFF_S

    def _admit(self, conn: socket.socket) -> bool:
        """Serve ``conn`` on a thread of its own, or close it at once when every slot is taken."""
        if not self._slots.acquire(blocking=False):
            self._count("busy")
            conn.close()
            return True
        try:
            threading.Thread(target=self._serve, args=(conn,), name="ckptio-partner-conn", daemon=True).start()
        except RuntimeError:  # no thread to be had: shed this connection, give the process a moment
            self._slots.release()
            conn.close()
            return False
        self._count("accepted")
        return True

    # ---- one connection --------------------------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.add(conn)
        try:
            with conn:
                try:
                    channel = server_handshake(conn, self._secret, time.monotonic() + self.limits.handshake_s)
                except (OSError, ValueError, CkptError) as exc:
                    self._count("unauthenticated")
                    log.debug("ckptio partner server: unauthenticated connection closed: %s", exc)
                    return
                self._requests(channel)
        except (OSError, ValueError, CkptError) as exc:
            # A broken connection ends here; a sender sees no acknowledgement and fails that copy.
            log.debug("ckptio partner server: connection dropped: %s", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            self._slots.release()

    def _requests(self, channel: Channel) -> None:
        while not self._stop.is_set():
            try:
                header = channel.recv_header(time.monotonic() + self.limits.idle_s)
            except (ConnectionError, TimeoutError):
                return  # the peer is done, or idle too long
            op = header.get("op")
            try:
                step, name = _checked(header)
                if op == "get":
                    self._get(channel, step, name)
                    continue
                if op != "put":
                    raise CorruptCheckpointError("partner request: unknown op")
                ok, error = self._put(channel, step, name, *_size_and_crc(header))
            except CorruptCheckpointError as exc:
                # The request's bytes (if any) were not consumed: answer, then drop the connection.
                channel.send_header({"ok": False, "error": f"refused: {exc}"}, time.monotonic() + self.limits.idle_s)
                return
            channel.send_header({"ok": ok, "error": error}, time.monotonic() + self.limits.idle_s)
            if not ok:
                return

    def _put(self, channel: Channel, step: int, name: str, size: int, crc: str) -> tuple[bool, str]:
        deadline = self.limits.transfer_deadline(size)
        why: list[str] = []

        def accept(digest: str, got_crc: str) -> bool:
            trailer = channel.recv_header(deadline)
            claimed = trailer.get("digest")
            if trailer.get("op") != "put-end" or not isinstance(claimed, str):
                raise CorruptCheckpointError("partner put: no put-end after the bytes")
            if got_crc != crc:
                why.append(f"crc32c mismatch on arrival ({got_crc}, sender says {crc})")
            elif not digests_equal(digest, claimed):
                why.append("digest mismatch on arrival: the bytes were altered in transit")
            return not why

        final = self.directory.local_path(partner_copy_key(step, name))
        kept = receive_to_file(channel.sock, final, size, deadline=deadline, idle_s=self.limits.idle_s,
                               accept=accept, active=self._temps)
        self._count("put" if kept else "put_refused")
        if not kept:
            log.warning("ckptio partner server: refused %s of step %s: %s", name, step, why[0] if why else "?")
            return False, why[0] if why else "refused"
        with self._lock:
            self._received.add((step, name))
        remove_abandoned_temps(self._partner_dirs(), stale_s=self.limits.stale_s, active=set(self._temps))
        return True, ""

    def _get(self, channel: Channel, step: int, name: str) -> None:
        for key in (own_copy_key(step, name), partner_copy_key(step, name)):
            try:
                fd = os.open(self.directory.local_path(key), os.O_RDONLY | os.O_NOFOLLOW)
            except (OSError, CkptError):
                continue
            try:
                size = os.fstat(fd).st_size
                deadline = self.limits.transfer_deadline(size)
                channel.send_header({"ok": True, "size": size}, deadline)
                send_file(channel.sock, fd, size, deadline=deadline, idle_s=self.limits.idle_s)
            finally:
                os.close(fd)
            self._count("get")
            return
        channel.send_header({"ok": False, "size": 0, "error": "not held here"}, time.monotonic() + self.limits.idle_s)

    # ---- cleanup ---------------------------------------------------------------------------------------------
    def _partner_dirs(self) -> list[str]:
        base = self.directory.local_path(PARTNERS_DIR)
        with contextlib.suppress(OSError), os.scandir(base) as entries:
            return [e.path for e in entries if parse_step_dir(e.name) is not None and e.is_dir(follow_symlinks=False)]
        return []

    def received(self) -> list[tuple[int, str]]:
        """The copies ``(step, name)`` this server received and kept: the local tier, their one deleter, drops
        those of steps that never committed when the writer stops."""
        with self._lock:
            return sorted(self._received)

    def close(self) -> None:
        """Stop serving, end open connections, and remove this process's temporary files. Never ``shutdown()`` the
        listener: the trainer holds the same socket for the next writer."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        self._thread.join()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # wakes their threads, whose cleanup then removes any half-received file
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 2.0
        while self._conns and time.monotonic() < deadline:
            time.sleep(0.01)
        remove_abandoned_temps(self._partner_dirs(), stale_s=self.limits.stale_s, active=set(self._temps),
                               own_too=True)
