"""A loopback forwarder: the host's processes reach a server inside the lab through 127.0.0.1.

Usage: ``python forward.py NETNS_FILE HOST PORT PORT_FILE`` (run by file path: it imports nothing of ckptio, so it
starts in milliseconds). It listens on 127.0.0.1 in the host's namespace and writes the port it got to PORT_FILE.
Each connection's thread moves into the namespace NETNS_FILE (``/run/netns/<node>``; ``setns`` of a network
namespace is per thread) and opens the upstream connection to HOST:PORT from there. A socket keeps the namespace it
was created in: the listener stays on the host's loopback, the upstream connections cross the node's shaped link
like the node's own traffic. The main thread never leaves the host's namespace, so ``ip netns pids`` does not count
the forwarder as one of the node's processes, and losing the node does not cut the host off.

Rules: it binds loopback only (no address outside the lab's namespaces is ever used), and it is one process the
lab started and stops by pid.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000
CHUNK = 1 << 16
LIBC = ctypes.CDLL(None, use_errno=True)


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy one direction until EOF, then pass the EOF on (half-close), so HTTP keep-alive and streaming work."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(client: socket.socket, netns_fd: int, host: str, port: int) -> None:
    if LIBC.setns(netns_fd, CLONE_NEWNET) != 0:  # this thread only
        client.close()
        return
    try:
        upstream = socket.create_connection((host, port), timeout=30)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(argv: list[str]) -> None:
    netns_file, host, port, port_file = argv[0], argv[1], int(argv[2]), argv[3]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    netns_fd = os.open(netns_file, os.O_RDONLY)
    with open(port_file + ".tmp", "w") as out:
        out.write(str(listener.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(client, netns_fd, host, port), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
