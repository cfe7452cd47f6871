"""How fast the ckptio writers of one node serialize, all of them at once: the profile's ``serialize_bytes_per_s``.

Before the store sees a byte, a writer frames each staged tensor as ``torch.save`` bytes
(:class:`ckptio.format.serialize.TensorFramer`) and checksums them (:func:`ckptio.format.checksum`): CPU work, done by
the writers of one node at the same time, each in its own process. So it is measured with the writer's own code, the
same way: ``writers`` forked processes start together, warm the framing cache as a first save would, and each reports
its steady-state rate. The framer changes a process-wide torch setting, so it only ever runs in the children. Must
never leave a child behind: children that do not answer within the time bound are killed, and an interrupt kills
them too.
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

from ckptio.errors import StorageError

_REPEATS = 3
_RATE = struct.Struct("d")


def serialize_once(tensor: object) -> float:
    """Bytes/s of the writer's framing plus checksum of ``tensor``, steady state (median of three).

    Runs in a child process only: the framer turns torch.save's zip CRC off for the whole process.
    """
    import torch

    from ckptio.format import checksum
    from ckptio.format.serialize import TensorFramer

    assert isinstance(tensor, torch.Tensor)
    raw = tensor.numpy().data.cast("B")
    framer = TensorFramer()
    dtype, shape = str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)
    framer.frame(dtype, shape, raw)  # the first save of a shape builds and caches the framing
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        checksum(framer.frame(dtype, shape, raw))
        times.append(time.perf_counter() - start)
    return raw.nbytes / max(statistics.median(times), 1e-9)


def serialize_bytes_per_s(nbytes: int, *, writers: int = 1, timeout_s: float = 30.0) -> float:
    """Per-writer serialize rate with ``writers`` writers serializing ``nbytes`` each at the same time."""
    import torch

    import ckptio.format
    import ckptio.format.serialize  # noqa: F401 - imported once here, not in every child

    tensor = torch.ones(max(nbytes // 4, 1))
    # A first torch.save in this process pays its one-time set-up here rather than in every child.
    torch.save(torch.ones(1), io.BytesIO())
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
        raise StorageError(f"no writer of the serialize measurement answered within {timeout_s:g} s")
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
