"""Writers racing the two conditional writes, round after round: the check that exclusion holds, for any storage.

:func:`race` starts one process per given storage (each receives its storage by pickling, as a writer process
does; two storages may be two mounts of one shared filesystem, on two clients). Every round, all processes wait at
a barrier, then each tries the create-only write of that round's key; they meet again, read ``latest``, meet again
and each tries a compare-and-swap of ``latest`` on the etag it read. :func:`race` returns, per round, who won each;
the caller asserts that exactly one did and that the store holds the winner's bytes.

Also here: filesystems that refuse some of what POSIX exclusion is built on
(:class:`~ckptio.storage.posix.fs_ops.FileSystemOps` stand-ins), for tests and for trying the fallbacks.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import queue
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptio.errors import AlreadyExistsError, PreconditionError
from ckptio.storage.base import IfMatch, Storage
from ckptio.storage.posix.fs_ops import FileSystemOps

__all__ = ["LATEST", "NoLinks", "NoLinksNoExclusiveCreate", "Round", "body_of", "create_key", "race"]

LATEST = "latest"


@dataclass(frozen=True, slots=True)
class Round:
    """Who won one round: the racers' indexes that won the create-only write, and the compare-and-swap."""

    number: int
    created: tuple[int, ...]
    swapped: tuple[int, ...]


def create_key(number: int) -> str:
    return f"race-{number:04d}/manifest.json"


def body_of(racer: int, number: int) -> bytes:
    return f"racer {racer} round {number}".encode()


@dataclass(frozen=True, slots=True)
class _Course:
    """What every racer shares: the rounds, the barrier they meet at, where results go, the parent's environment."""

    rounds: int
    barrier: Any
    results: Any
    env: dict[str, str]


def _racer(storage: Storage, me: int, course: _Course) -> None:
    try:
        _race_rounds(storage, me, course)
    except BaseException:
        course.barrier.abort()  # the other racers stop at once instead of waiting out the barrier
        course.results.put((me, traceback.format_exc(), None))  # the parent names what stopped this racer
        raise


def _race_rounds(storage: Storage, me: int, course: _Course) -> None:
    os.environ.update(course.env)
    storage.exists(LATEST)  # open clients and connections before the first barrier
    barrier = course.barrier
    created: list[int] = []
    swapped: list[int] = []
    for number in range(course.rounds):
        barrier.wait()
        try:
            storage.put(create_key(number), body_of(me, number), mode="create")
            created.append(number)
        except AlreadyExistsError:
            pass
        barrier.wait()
        etag = storage.head(LATEST).etag
        barrier.wait()
        try:
            storage.put(LATEST, body_of(me, number), mode=IfMatch(etag))
            swapped.append(number)
        except PreconditionError:
            pass
    course.results.put((me, created, swapped))


def race(storages: Sequence[Storage], rounds: int, *, timeout_s: float = 600.0) -> list[Round]:
    """Race one process per storage for ``rounds`` rounds (``latest`` is created first); who won each round.

    Raises TimeoutError when a racer does not finish in ``timeout_s`` (its process is killed), and RuntimeError
    when one fails; either names what stopped a racer that failed (its traceback)."""
    storages[0].put(LATEST, b"start")
    context = multiprocessing.get_context("spawn")
    # A barrier's timeout frees the other racers when one has died.
    course = _Course(rounds=rounds, barrier=context.Barrier(len(storages), timeout=min(timeout_s, 120.0)),
                     results=context.Queue(), env=dict(os.environ))
    results = course.results
    procs = [context.Process(target=_racer, args=(s, i, course), daemon=True) for i, s in enumerate(storages)]
    for proc in procs:
        proc.start()
    won: dict[int, tuple[list[int], list[int]]] = {}
    failed: list[str] = []
    try:
        while len(won) + len(failed) < len(procs):
            me, created, swapped = results.get(timeout=timeout_s)
            if swapped is None:
                failed.append(f"racer {me}: {created}")
            else:
                won[me] = (created, swapped)
    except queue.Empty:
        why = "".join(f"\n{f}" for f in failed)
        raise TimeoutError(f"racers did not finish {rounds} rounds in {timeout_s:.0f} s "
                           f"(exit codes {[p.exitcode for p in procs]}){why}") from None
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if failed:
        raise RuntimeError("a racer failed:\n" + "\n".join(failed))
    return [Round(number=n, created=tuple(i for i in sorted(won) if n in won[i][0]),
                  swapped=tuple(i for i in sorted(won) if n in won[i][1])) for n in range(rounds)]


class NoLinks(FileSystemOps):
    """A filesystem without hard links (as some FUSE mounts of object stores): ``link`` fails with EPERM."""

    def link(self, src: str, dst: str) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted (no hard links here)", dst)


class NoLinksNoExclusiveCreate(NoLinks):
    """A filesystem that refuses both hard links and ``O_EXCL`` creates: nothing to build exclusion on."""

    def create_exclusive(self, path: str, data: bytes) -> os.stat_result:
        raise OSError(errno.EINVAL, "Invalid argument (O_EXCL refused here)", path)
