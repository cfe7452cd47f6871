"""Host-side costs of a save: how fast the ckptio writers of one node serialize, all of them at once.

Owns the measurement behind the profile's ``serialize_bytes_per_s``. A writer turns each staged tensor into file
bytes with ``torch.save`` into memory and a crc32c before the store sees a byte; that is CPU work, and the
writers of one node do it at the same time, each in its own process. So the rate is measured the same way:
``writers`` forked processes start together and each reports its own rate. Must never leave a child behind:
children that do not answer within the time bound are killed, and an interrupt kills them too.
"""

from __future__ import annotations

import io
import os
import select
import signal
import statistics
import struct
import time
import warnings

_REPEATS = 3
_RATE = struct.Struct("d")


def serialize_once(tensor: object) -> float:
    """Bytes/s of one ``torch.save`` into memory plus a crc32c of the result (median of three)."""
    import crc32c
    import torch

    assert isinstance(tensor, torch.Tensor)
    nbytes = tensor.numel() * tensor.element_size()
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        out = io.BytesIO()
        torch.save(tensor, out)
        crc32c.crc32c(out.getvalue())
        times.append(time.perf_counter() - start)
    return nbytes / max(statistics.median(times), 1e-9)


def serialize_bytes_per_s(nbytes: int, *, writers: int = 1, timeout_s: float = 30.0) -> float:
    """Per-writer serialize rate with ``writers`` writers serializing ``nbytes`` each at the same time."""
    import torch

    tensor = torch.ones(max(nbytes // 4, 1))
    if writers <= 1:
        return serialize_once(tensor)
    # Once in the parent first: lazy imports and first-call set-up then happen once, not in every child.
    serialize_once(torch.ones(1))
    children: dict[int, int] = {}  # pid → read end of its pipe
    go_read, go_write = os.pipe()
    try:
        for _ in range(writers):
            pid, fd = _fork_child(tensor, go_read)
            children[pid] = fd
        os.write(go_write, b"x" * writers)  # one byte each: they start together
        rates = _collect(list(children.values()), time.monotonic() + timeout_s)
    finally:
        for fd in (go_read, go_write, *children.values()):
            os.close(fd)
        _reap(list(children))
    if not rates:
        return serialize_once(tensor)  # no child answered in time: fall back to one writer alone
    return statistics.median(rates)


def _fork_child(tensor: object, go_read: int) -> tuple[int, int]:
    result_read, result_write = os.pipe()
    with warnings.catch_warnings():
        # The parent may hold idle helper threads; the child only computes and writes one pipe, then _exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(result_read)
            os.read(go_read, 1)
            os.write(result_write, _RATE.pack(serialize_once(tensor)))
            code = 0
        finally:
            os._exit(code)
    os.close(result_write)
    return pid, result_read


def _collect(fds: list[int], deadline: float) -> list[float]:
    rates, waiting = [], list(fds)
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(waiting, [], [], left)
        for fd in ready:
            data = os.read(fd, _RATE.size)
            if len(data) == _RATE.size:
                rates.append(_RATE.unpack(data)[0])
            waiting.remove(fd)
    return rates


def _reap(pids: list[int]) -> None:
    for pid in pids:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:
            continue
