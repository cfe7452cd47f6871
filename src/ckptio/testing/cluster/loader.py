"""A data loader's read load on the store: read every file under a directory, again and again, and report the
throughput over time.

Usage: ``python loader.py DIR OUT [INTERVAL_S] [BLOCK]`` (run by file path: no ckptio or torch import, so it
starts at once and costs the node no CPU beyond the reads). Every INTERVAL_S it appends one JSON line to OUT:
``{"t": <unix time>, "bytes": <read in the interval>, "mbit": <rate in the interval>}``.

Rules: each file's pages are dropped from the page cache after it is read (``POSIX_FADV_DONTNEED``), so every pass
reads from the store across the node's link, as a loader streaming a data set larger than memory would. It runs
until it is killed (the lab stops it, or loses its node).
"""

from __future__ import annotations

import json
import os
import sys
import time


def files_under(directory: str) -> list[str]:
    found: list[str] = []
    for parent, _dirs, names in os.walk(directory):
        found.extend(os.path.join(parent, name) for name in sorted(names))
    return found


class Report:
    """The throughput log: bytes are counted as they arrive and written out once per interval."""

    def __init__(self, out: str, interval: float) -> None:
        self.file = open(out, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self.interval = interval
        self.start, self.bytes = time.time(), 0

    def add(self, count: int) -> None:
        self.bytes += count
        now = time.time()
        if now - self.start >= self.interval:
            rate = self.bytes * 8 / (now - self.start) / 1e6
            self.file.write(json.dumps({"t": now, "bytes": self.bytes, "mbit": rate}) + "\n")
            self.start, self.bytes = now, 0


def read_file(path: str, block: int, report: Report) -> None:
    """Read one file to its end, counting each block; then drop its pages (the next pass reads the store again)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        while True:
            data = os.read(fd, block)
            if not data:
                break
            report.add(len(data))
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def main(argv: list[str]) -> None:
    directory, out = argv[0], argv[1]
    interval = float(argv[2]) if len(argv) > 2 else 0.5
    block = int(argv[3]) if len(argv) > 3 else 1 << 20
    report = Report(out, interval)
    while True:
        paths = files_under(directory)
        if not paths:
            time.sleep(0.1)
            report.add(0)
        for path in paths:
            read_file(path, block, report)


if __name__ == "__main__":
    main(sys.argv[1:])
