"""A bulk TCP transfer between two lab nodes, iperf-style, in plain Python sockets (iperf is not installed).

Usage (run by file path; no ckptio import):
- ``python netperf.py serve ADDRESS PORT OUT``: accept connections, count what arrives on each, and when all of
  them end write ``{"bytes": n, "seconds": s, "mbit": r}`` to OUT, where ``s`` runs from the first byte received
  to the last (the rate the link carried, without connection setup);
- ``python netperf.py send HOST PORT SECONDS [STREAMS]``: send zeros for SECONDS over STREAMS connections.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

CHUNK = 1 << 16


def serve(address: str, port: int, out: str, streams: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(streams)
    with open(out + ".ready", "w"):
        pass  # the sender may connect now (a probe connection would count as a stream)
    totals: list[int] = []
    marks: list[float] = []
    lock = threading.Lock()

    def receive(conn: socket.socket) -> None:
        got, first, last = 0, 0.0, 0.0
        buffer = bytearray(CHUNK)
        while True:
            n = conn.recv_into(buffer)
            if not n:
                break
            last = time.monotonic()
            first = first or last
            got += n
        conn.close()
        with lock:
            totals.append(got)
            marks.extend([first, last])

    threads = []
    for _ in range(streams):
        conn, _ = listener.accept()
        threads.append(threading.Thread(target=receive, args=(conn,)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    seconds = max(marks) - min(m for m in marks if m) if any(marks) else 0.0
    total = sum(totals)
    with open(out + ".tmp", "w") as report:
        json.dump({"bytes": total, "seconds": seconds, "mbit": total * 8 / seconds / 1e6 if seconds else 0.0}, report)
    os.replace(out + ".tmp", out)


def send(host: str, port: int, seconds: float, streams: int) -> None:
    payload = bytes(CHUNK)

    def one() -> None:
        conn = socket.create_connection((host, port), timeout=30)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            conn.sendall(payload)
        conn.close()

    threads = [threading.Thread(target=one) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 1)
    else:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 1)
