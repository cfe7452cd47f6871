"""A partner server in a process of its own, for tests/engine/test_partner_security.py (its RSS and its file
descriptor limit are then its own, as a writer's are).

Usage: python partner_server_proc.py SPEC_JSON; the secret comes as one hex line on stdin (never argv or the
environment, as in a job). SPEC: local (the node's local dir), nofile (lower the soft RLIMIT_NOFILE to this,
optional), limits (PartnerLimits fields, optional). Prints ``{"port", "pid"}``, then answers stdin commands one
JSON line each: ``stats`` (the server's counters, its RSS and open descriptors), ``close [steps...]`` (``close()``,
then the local tier drops the copies received for steps not listed, as a writer's local level does; then exit).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys

from ckptio.engine.partner import PartnerLimits, PartnerServer
from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.local_tier import LocalTier
from ckptio.storage import open_storage

COUNTERS = ("accepted", "busy", "unauthenticated", "accept_backoff", "put", "put_refused", "get")


def rss_bytes() -> int | None:
    try:  # may itself run into EMFILE while a flood holds every descriptor: then unknown, never a crash
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def main() -> None:
    spec = json.loads(sys.argv[1])
    secret = bytes.fromhex(sys.stdin.readline().strip())
    if spec.get("nofile"):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(spec["nofile"]), hard))
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    local = open_storage(spec["local"], fsync=False)
    server = PartnerServer(listener, local, secret=secret, limits=PartnerLimits(**spec.get("limits", {})))
    print(json.dumps({"port": listener.getsockname()[1], "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "stats":
            counters = {k: server.stats[k] for k in COUNTERS}
            print(json.dumps({**counters, "rss": rss_bytes(), "fds": open_fds()}), flush=True)
        elif cmd == "close":
            server.close()
            tier = LocalTier(local, durable=local, local_records=None, live=LiveSteps(), budget=None, rank=0)
            tier.drop_partner_copies(server.received(), committed={int(a) for a in args})
            print(json.dumps({"closed": True}), flush=True)
            return


if __name__ == "__main__":
    main()
