"""What the partner digest (issue 16) costs the writer, per GiB, against crc32c and against the copy itself.

A writer sending a file to a partner now reads it in chunks, updates crc32c and SHA-256, and sends each chunk;
before, it handed the file to ``sendfile`` and hashed nothing. Measured in one run, on one file of ``--mib`` MiB
(in the page cache after a warm-up, as a just-written shard is):

1. hashing alone, chunked as the writer does: crc32c (the anchor: what the rank index already pays) and
   crc32c + SHA-256 (what the partner copy now pays); ``sha256_vs_crc32c`` = the second ÷ the first;
2. the copy itself: ``send_files`` over loopback to a partner server in its own process (authenticated, the server
   checking crc32c and digest as always), once hashing on the sender (the first partner of a save) and once with
   the digests known (``digests=``, what every further partner costs); ``hashed_copy_vs_unhashed`` = the first ÷
   the second, i.e. what the digest adds to the writer's part of a partner copy.

    .venv/bin/python bench/bench_partner_digest.py [--mib 512] [--reps 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import crc32c

from _common import GiB, MiB, median_time, ratio_line, scratch_dir
from ckptio.engine.partner import send_files
from ckptio.engine.partner.digest import CHUNK, new_hasher

SERVER = r"""
import json, socket, sys
from ckptio.engine.partner import PartnerServer
from ckptio.storage import open_storage
secret = bytes.fromhex(sys.stdin.readline().strip())
listener = socket.create_server(("127.0.0.1", 0))
server = PartnerServer(listener, open_storage(sys.argv[1], fsync=False), secret=secret)
print(listener.getsockname()[1], flush=True)
sys.stdin.readline()
server.close()
"""


def hash_file(path: Path, *, digest: bool) -> None:
    """The writer's read loop without the socket: one reused chunk buffer, crc32c, and SHA-256 when asked."""
    hasher, value, buf = new_hasher() if digest else None, 0, bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(buf):
            value = crc32c.crc32c(view[:k], value)
            if hasher is not None:
                hasher.update(view[:k])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=512, help="size of the file copied (MiB)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per figure (median)")
    parser.add_argument("--dir", default=None, help="scratch directory parent (default: $TMPDIR)")
    args = parser.parse_args()

    with scratch_dir(args.dir, "ckptio-digest-") as base:
        src = base / "shard.distcp"
        with open(src, "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(MiB))
        size, gib = src.stat().st_size, src.stat().st_size / GiB
        crc = f"{crc32c.crc32c(src.read_bytes()):08x}"

        crc_s, _ = median_time(lambda _: hash_file(src, digest=False), args.reps)
        both_s, _ = median_time(lambda _: hash_file(src, digest=True), args.reps)

        secret = secrets.token_bytes(32)
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(base / "partner")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(secret.hex() + "\n")
        server.stdin.flush()
        port = int(server.stdout.readline())
        files = [("__0_0-1.distcp", str(src), size, crc)]
        try:
            digests = send_files("127.0.0.1", port, 1, files, secret=secret, timeout_s=60, who="bench")
            hashed_s, _ = median_time(
                lambda _: send_files("127.0.0.1", port, 2, files, secret=secret, timeout_s=60, who="bench"),
                args.reps)
            known_s, _ = median_time(
                lambda _: send_files("127.0.0.1", port, 2, files, secret=secret, timeout_s=60, who="bench",
                                       digests=digests), args.reps)
        finally:
            server.stdin.write("close\n")
            server.stdin.flush()
            server.wait(timeout=60)

    per_gib = {"crc32c": crc_s / gib, "crc32c+sha256": both_s / gib, "copy hashed": hashed_s / gib,
               "copy, digest known": known_s / gib}
    print(f"file {args.mib} MiB, median of {args.reps}; seconds per GiB on this machine:")
    for name, value in per_gib.items():
        print(f"  {name:<20} {value:7.3f} s/GiB")
    print(f"  SHA-256 adds {(both_s - crc_s) / gib:.3f} s/GiB of writer CPU; the copy {(hashed_s - known_s) / gib:.3f}"
          " s/GiB of wall time")
    print(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), **per_gib}))
    ratio_line(sha256_vs_crc32c=both_s / crc_s, hashed_copy_vs_unhashed=hashed_s / known_s,
               digest_s_per_gib=(both_s - crc_s) / gib)


if __name__ == "__main__":
    main()
