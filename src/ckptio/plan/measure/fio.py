"""fio as the anchor: the same directory, the same writers, a tool everyone trusts.

Owns running ``fio`` (sequential 16 MiB writes ending in an fsync, then reads of the same files with the page
cache invalidated) and reading its JSON. Must never write outside the directory it is given, and never outlive
its time bound or an interrupt.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from typing import Any

from ckptio.errors import ConfigError, StorageError

_POLL_S = 0.1


def fio_available() -> bool:
    return shutil.which("fio") is not None


def run_fio(
    directory: str,
    *,
    writers: int,
    file_size_bytes: int,
    runtime_s: float,
    stop: threading.Event | None = None,
) -> dict[str, float]:
    """fio's write and read bytes/s in ``directory``: ``writers`` jobs, one ``file_size_bytes`` file each."""
    if not fio_available():
        raise ConfigError("fio is not installed (Debian: apt-get install fio; or `make sysdeps`)")
    half = max(1, int(runtime_s / 2))
    common = [
        "fio",
        "--name=ckptio-anchor",
        f"--directory={directory}",
        "--bs=16M",
        f"--size={file_size_bytes}",
        f"--numjobs={writers}",
        "--ioengine=psync",
        "--group_reporting",
        "--output-format=json",
        f"--runtime={half}",
    ]
    write = _run([*common, "--rw=write", "--end_fsync=1"], half, stop)
    read = _run([*common, "--rw=read", "--invalidate=1"], half, stop)
    return {
        "write_bytes_per_s": float(write["jobs"][0]["write"]["bw_bytes"]),
        "read_bytes_per_s": float(read["jobs"][0]["read"]["bw_bytes"]),
    }


def _run(argv: list[str], runtime_s: int, stop: threading.Event | None) -> dict[str, Any]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # fio's --runtime bounds the I/O; the slack covers its start-up and the final fsync.
    limit = time.monotonic() + runtime_s + 30
    try:
        while proc.poll() is None:
            if (stop is not None and stop.is_set()) or time.monotonic() > limit:
                proc.terminate()
                proc.wait(timeout=10)
                raise StorageError("fio was stopped before it finished", path=argv[2].split("=", 1)[1])
            time.sleep(_POLL_S)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise StorageError(f"fio failed ({proc.returncode}): {err.strip()[-300:]}")
    try:
        parsed: dict[str, Any] = json.loads(out[out.index("{") :])
    except (ValueError, json.JSONDecodeError) as exc:
        raise StorageError(f"cannot read fio's JSON output: {exc}") from None
    return parsed
