"""POSIX create-only and compare-and-swap exclude writers in other processes (and, built on link() and O_EXCL,
on other clients: tests/lab/test_cross_client_locks.py), survive a holder killed with -9, and refuse a filesystem
that offers neither primitive with a named error. Real processes, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptio.errors import AlreadyExistsError, StorageError, StoreCapabilityError
from ckptio.storage import IfMatch, PosixStorage
from ckptio.storage.capabilities import CONDITIONAL_CREATE, capability_problems, detect_capabilities
from ckptio.storage.posix import exclusion
from ckptio.storage.posix.exclusion import LOCK_PREFIX
from ckptio.storage.posix.fs_ops import FileSystemOps
from ckptio.testing.write_races import LATEST, NoLinks, NoLinksNoExclusiveCreate, body_of, create_key, race

ROUNDS = 200


@pytest.mark.parametrize("ops", [FileSystemOps(), NoLinks()], ids=["link", "no-links"])
def test_two_processes_race_create_and_swap_one_winner_every_round(tmp_path: Path, ops: FileSystemOps) -> None:
    storages = [PosixStorage(tmp_path, fsync=True, ops=ops) for _ in range(2)]
    rounds = race(storages, ROUNDS)
    assert len(rounds) == ROUNDS
    assert [r.number for r in rounds if len(r.created) != 1] == [], "exactly one create-only write wins a round"
    assert [r.number for r in rounds if len(r.swapped) != 1] == [], "exactly one compare-and-swap wins a round"
    check = storages[0]
    for r in rounds:
        assert check.get(create_key(r.number)) == body_of(r.created[0], r.number)
    assert check.get(LATEST) == body_of(rounds[-1].swapped[0], ROUNDS - 1)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(LOCK_PREFIX)], "every lock released"


def test_without_hard_links_create_only_falls_back_to_the_lock(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False, ops=NoLinks())
    storage.put("m", b"first", mode="create")
    with pytest.raises(AlreadyExistsError):
        storage.put("m", b"second", mode="create")
    assert storage.get("m") == b"first"
    assert "O_EXCL" in storage.write_conditions.create
    caps = detect_capabilities(storage, refresh=True)
    assert caps.conditional_writes and "O_EXCL" in caps.get(CONDITIONAL_CREATE).detail


def test_a_filesystem_offering_neither_primitive_is_refused_by_name(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False, ops=NoLinksNoExclusiveCreate())
    with pytest.raises(StoreCapabilityError, match=r"refuses hard links .* and exclusive creates"):
        storage.put("m", b"x", mode="create")
    first = storage.put("latest", b"1")
    with pytest.raises(StoreCapabilityError):
        storage.put("latest", b"2", mode=IfMatch(first.etag))
    assert storage.get("latest") == b"1" and not storage.exists("m")
    caps = detect_capabilities(storage, refresh=True)
    assert not caps.has("conditional_create") and not caps.has("compare_and_swap")
    problems = capability_problems(caps, commit="conditional")
    assert problems and "does not honour conditional writes" in problems[0]


def _lock(tmp_path: Path, name: str, holder: str, age_s: float = 0.0) -> Path:
    lock = tmp_path / f"{LOCK_PREFIX}{name}"
    lock.write_text(holder)
    if age_s:
        then = time.time() - age_s
        os.utime(lock, (then, then))
    return lock


def test_a_lock_whose_holder_died_here_is_broken_at_once(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    first = storage.put("latest", b"1")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    lock = _lock(tmp_path, "latest", f"{exclusion._MACHINE} {dead.stdout.strip()} abcd")
    start = time.monotonic()
    storage.put("latest", b"2", mode=IfMatch(first.etag))
    assert time.monotonic() - start < exclusion.STALE_LOCK_S / 2
    assert storage.get("latest") == b"2" and not lock.exists()


def test_a_lock_of_another_machine_is_broken_only_once_stale(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    first = storage.put("latest", b"1")
    monkeypatch.setattr(exclusion, "LOCK_WAIT_S", 0.5)
    lock = _lock(tmp_path, "latest", "another-machine/1 4242 abcd")
    with pytest.raises(StorageError, match="stayed locked"):
        storage.put("latest", b"2", mode=IfMatch(first.etag))
    assert storage.get("latest") == b"1" and lock.exists(), "a live holder's lock is never broken"
    _lock(tmp_path, "latest", "another-machine/1 4242 abcd", age_s=exclusion.STALE_LOCK_S + 5)
    storage.put("latest", b"2", mode=IfMatch(first.etag))
    assert storage.get("latest") == b"2" and not lock.exists()


_HOLD_AND_HANG = """
import sys, time
from ckptio.storage import IfMatch, PosixStorage
from ckptio.storage.posix.fs_ops import FileSystemOps

class Hang(FileSystemOps):
    def replace(self, src, dst):
        if dst.endswith("/latest"):
            print("holding", flush=True)
            time.sleep(3600)
        super().replace(src, dst)

storage = PosixStorage(sys.argv[1], fsync=False, ops=Hang())
storage.put("latest", b"hung", mode=IfMatch(storage.head("latest").etag))
"""


def test_a_holder_killed_with_minus_9_does_not_lock_the_name_for_long(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    first = storage.put("latest", b"1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen([sys.executable, "-c", _HOLD_AND_HANG, str(tmp_path)], stdout=subprocess.PIPE,
                          text=True, env=env) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            assert any(n.startswith(LOCK_PREFIX) for n in os.listdir(tmp_path)), "it holds the lock"
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            start = time.monotonic()
            storage.put("latest", b"2", mode=IfMatch(first.etag))
            assert time.monotonic() - start < exclusion.STALE_LOCK_S / 2, "a dead holder here is seen at once"
        finally:
            if holder.poll() is None:
                holder.kill()
    assert storage.get("latest") == b"2"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(LOCK_PREFIX)]


class CachedStat(FileSystemOps):
    """A client whose attribute cache still answers a stat of one name with the file it held before another client
    replaced it (GlusterFS's FUSE client, for about a second): a stand-in for a second mount, which the lab's
    tests/lab/test_cross_client_locks.py races for real."""

    def __init__(self, name: str, stale: os.stat_result, answers: int) -> None:
        self.name, self.stale, self.answers = name, stale, answers

    def stat(self, path: str) -> os.stat_result:
        if os.path.basename(path) == self.name and self.answers > 0:
            self.answers -= 1
            return self.stale
        return super().stat(path)


def test_a_swap_compares_the_file_the_directory_holds_not_a_cached_one(tmp_path: Path) -> None:
    first = PosixStorage(tmp_path, fsync=False)
    first.put("latest", b"v1")
    seen = first.head("latest")  # what the other client read before the name changed
    old = os.stat(tmp_path / "latest")
    first.put("latest", b"v2", mode=IfMatch(seen.etag))  # this client replaces it
    behind = PosixStorage(tmp_path, fsync=False, ops=CachedStat("latest", old, answers=5))
    with pytest.raises(StorageError):  # its cache still shows v1, which the etag it holds matches
        behind.put("latest", b"v3", mode=IfMatch(seen.etag))
    assert first.get("latest") == b"v2"


def test_a_cached_view_that_never_catches_up_is_refused_loudly(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exclusion, "FRESH_VIEW_S", 0.2)
    first = PosixStorage(tmp_path, fsync=False)
    first.put("latest", b"v1")
    seen = first.head("latest")
    old = os.stat(tmp_path / "latest")
    first.put("latest", b"v2", mode=IfMatch(seen.etag))
    stuck = PosixStorage(tmp_path, fsync=False, ops=CachedStat("latest", old, answers=10**6))
    with pytest.raises((TimeoutError, StorageError)):
        stuck.put("latest", b"v3", mode=IfMatch(seen.etag))
    assert first.get("latest") == b"v2"


class ReplaceBreaks(FileSystemOps):
    """A filesystem whose rename fails with an error no writer expects."""

    def replace(self, src: str, dst: str) -> None:
        raise OSError(5, "rename broke here")


def test_a_racer_that_fails_is_named_with_its_reason(tmp_path: Path) -> None:
    storages = [PosixStorage(tmp_path, fsync=False, ops=ReplaceBreaks()) for _ in range(2)]
    storages[0].put(LATEST, b"start", mode="create")  # race() overwrites it through these ops: publish it first
    with pytest.raises(RuntimeError, match="rename broke here"):
        race([PosixStorage(tmp_path, fsync=False), *storages[1:]], 3, timeout_s=60)
