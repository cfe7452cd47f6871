"""Network namespaces, the bridge that joins them, and the ``tc htb`` shaping of every link.

Rules:
- Every interface and address lives inside a namespace the lab made: veth pairs are created with both ends already
  in lab namespaces (``ip -n FABRIC link add ... peer ... netns NODE``), so nothing ever appears in the host's
  namespace, and no route leads out of the machine (the bridge has no uplink).
- A link is shaped on both ends of its veth, in the direction each end sends: the endpoint's egress is its upload,
  the bridge port's egress its download. Each direction is one htb tree at the link's rate with one class per peer
  (matched by the peer's address, ``u32``), each guaranteed an equal share and allowed the whole rate: senders into
  one node share its download fairly, as flows on a real NIC do. (``netem``, ``fq`` and ``sfq`` are not in every
  kernel; ``htb``, ``u32`` and ``pfifo`` are.)
- A thread may enter a namespace (``setns`` is per thread for the network namespace) to open a socket there; the
  socket keeps its namespace for life, which is how the lab probes ports and the loopback forwarder reaches in.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from ckptio.testing.cluster.procs import LabError, run

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
BRIDGE = "br0"
DEVICE = "eth0"  # each endpoint's NIC, inside its own namespace


def ns_path(name: str) -> Path:
    return NETNS_DIR / name


def add(name: str) -> None:
    """Create a namespace with its loopback up."""
    run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])


def delete(name: str) -> None:
    """Delete a namespace by name (a no-op when it is gone)."""
    if ns_path(name).exists():
        run(["ip", "netns", "del", name], check=False)


def pids(name: str) -> list[int]:
    """The processes inside namespace ``name`` (by namespace, never by name or pattern)."""
    if not ns_path(name).exists():
        return []
    done = run(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def listed() -> list[str]:
    """Every namespace name ``ip netns`` knows."""
    done = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def enter_argv(name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run in namespace ``name``'s network only: unlike ``ip netns exec``, ``nsenter --net`` keeps the
    host's mount namespace, so a FUSE mount made this way is visible to every process on the machine."""
    return ["nsenter", f"--net={ns_path(name)}", "--", *argv]


_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with this thread in namespace ``name``; the thread's own namespace comes back after."""
    with open("/proc/thread-self/ns/net", "rb") as home, open(ns_path(name), "rb") as there:
        if _libc.setns(there.fileno(), CLONE_NEWNET) != 0:
            raise LabError(f"setns into {name}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if _libc.setns(home.fileno(), CLONE_NEWNET) != 0:
                raise LabError(f"setns back from {name}: {os.strerror(ctypes.get_errno())}")


def connect(name: str, host: str, port: int, timeout: float = 1.0) -> socket.socket:
    """A TCP socket connected to ``host:port`` from inside namespace ``name`` (opened by a helper thread, so the
    caller's thread never changes namespace)."""
    result: list[socket.socket | BaseException] = []

    def opener() -> None:
        try:
            with entered(name):
                result.append(socket.create_connection((host, port), timeout=timeout))
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    thread = threading.Thread(target=opener, daemon=True)
    thread.start()
    thread.join()
    got = result[0]
    if isinstance(got, BaseException):
        raise got
    return got


def listening(name: str, host: str, port: int) -> bool:
    """True when something accepts TCP connections at ``host:port`` inside namespace ``name``."""
    try:
        connect(name, host, port, timeout=0.5).close()
    except OSError:
        return False
    return True


def make_bridge(fabric: str) -> None:
    run(["ip", "-n", fabric, "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "-n", fabric, "link", "set", BRIDGE, "up"])


def attach(fabric: str, endpoint: str, port: str, address: str, prefix_len: int) -> None:
    """Join namespace ``endpoint`` to the bridge: its ``eth0`` at ``address``, its bridge port named ``port``."""
    run(["ip", "-n", fabric, "link", "add", port, "type", "veth", "peer", "name", DEVICE, "netns", endpoint])
    run(["ip", "-n", fabric, "link", "set", port, "master", BRIDGE])
    run(["ip", "-n", fabric, "link", "set", port, "up"])
    run(["ip", "-n", endpoint, "addr", "add", f"{address}/{prefix_len}", "dev", DEVICE])
    run(["ip", "-n", endpoint, "link", "set", DEVICE, "up"])


def shape(ns: str, dev: str, mbit: float, peers: Sequence[str], match: str) -> None:
    """One direction of a link: an htb tree at ``mbit`` on ``dev``'s egress, one class per peer address
    (``match`` is ``dst`` on the endpoint's side, ``src`` on the bridge's), plus a default class for the rest (ARP).
    Each class is guaranteed its equal share and may borrow up to the whole rate."""
    rate = f"{mbit:g}mbit"
    share = f"{max(mbit / max(len(peers), 1), 0.1):g}mbit"
    tc = ["tc", "-n", ns]
    # Bursts of 64 KiB let a whole GSO super-packet through at once; quantum keeps htb from warning at high rates.
    common = ["burst", "64k", "cburst", "64k", "quantum", "60000"]
    run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)  # a reshape replaces the whole tree
    run([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "9"])
    run([*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate,
         *common])
    classes = [(9, None), *((10 + i, peer) for i, peer in enumerate(peers))]
    for minor, peer in classes:
        run([*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{minor:x}", "htb", "rate", share,
             "ceil", rate, *common])
        run([*tc, "qdisc", "add", "dev", dev, "parent", f"1:{minor:x}", "handle", f"{minor:x}:", "pfifo",
             "limit", "1000"])
        if peer is not None:
            run([*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match",
                 "ip", match, f"{peer}/32", "flowid", f"1:{minor:x}"])


def shape_link(fabric: str, endpoint: str, port: str, mbit: float, peers: Sequence[str]) -> None:
    """Shape both directions of one endpoint's link at ``mbit``: upload on its NIC, download on its bridge port."""
    shape(endpoint, DEVICE, mbit, peers, "dst")
    shape(fabric, port, mbit, peers, "src")


def class_bytes(ns: str, dev: str) -> dict[str, int]:
    """Bytes sent per htb class on ``dev`` (``1:10`` → n): what the shaping carried, for checks and reports."""
    done = run(["tc", "-n", ns, "-s", "class", "show", "dev", dev], check=False)
    out: dict[str, int] = {}
    current = None
    for line in done.stdout.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            current = words[2]
        elif current and words[:1] == ["Sent"]:
            out[current] = int(words[1])
            current = None
    return out
