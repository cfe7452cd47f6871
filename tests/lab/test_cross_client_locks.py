"""Exclusion across clients of one shared filesystem: two processes write one MooseFS (or GlusterFS) directory through
two FUSE mounts on two lab nodes (two clients, as two hosts of a cluster are) and race, round after round, the
create-only write, the compare-and-swap and the root claim. Exactly one wins every round.

A bind mount would be one client and would prove nothing: a directory ``flock`` (what the POSIX compare-and-swap
used before) excludes processes of one client but is ignored across MooseFS mounts. Skips where the lab cannot run.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import pytest

from ckptio.engine.owner_record import OWNER_KEY, claim_root, read_owner, release_root
from ckptio.errors import RootInUseError
from ckptio.storage import PosixStorage, Storage
from ckptio.storage.posix.exclusion import LOCK_PREFIX
from ckptio.storage.posix.fs_ops import FileSystemOps
from ckptio.testing.write_races import LATEST, NoLinks, body_of, create_key, race
from tests.lab.conftest import TwoMounts

pytestmark = pytest.mark.lab

ROUNDS = {"moosefs": 200, "glusterfs": 20}  # a GlusterFS round takes a second or more (its clients' caches expire)
CLAIM_ROUNDS = 50


@pytest.mark.parametrize("ops", [FileSystemOps(), NoLinks()], ids=["link", "no-links"])
def test_two_clients_race_create_and_swap_one_winner_every_round(two_mounts: TwoMounts,
                                                                 ops: FileSystemOps) -> None:
    first, second = two_mounts.first, two_mounts.second
    storages = [PosixStorage(first, fsync=True, ops=ops), PosixStorage(second, fsync=True, ops=ops)]
    count = ROUNDS[two_mounts.lab.config.pfs]
    glusterfs = two_mounts.lab.config.pfs == "glusterfs"
    try:
        rounds = race(storages, count, timeout_s=240 if glusterfs else 900)
    except (TimeoutError, RuntimeError) as exc:
        if not glusterfs or "TimeoutError" not in f"{type(exc).__name__}: {exc}":
            raise
        # Seen under load: a racer ran out of time on a lock (a released lock file still visible to the other
        # client, waited out as stale) or on its client's cached view of `latest`; the reason is in the message.
        pytest.xfail(f"GlusterFS: {exc}")
    assert [r.number for r in rounds if len(r.created) != 1] == [], "exactly one create-only write wins a round"
    # GlusterFS's FUSE client caches a name's entry and attributes (1 s by default): a second client under the lock
    # could still see the `latest` the first had just replaced and swap over it, until the lock holder compared the
    # file the directory's listing names (storage/posix/exclusion.py).
    not_one = [r.number for r in rounds if len(r.swapped) != 1]
    assert not_one == [], "exactly one compare-and-swap wins a round"
    for number in (0, count // 2, count - 1):  # what the winner wrote, seen through either client
        winner = rounds[number].created[0]
        assert {s.get(create_key(number)) for s in storages} == {body_of(winner, number)}
    assert {s.get(LATEST) for s in storages} == {body_of(rounds[-1].swapped[0], count - 1)}
    assert not [n for n in os.listdir(first) if n.startswith(LOCK_PREFIX)], "every lock released"


def _claimer(storage: Storage, rounds: int, barrier: Any, results: Any) -> None:
    won = []
    for number in range(rounds):
        barrier.wait()
        try:
            record = claim_root(storage, lease_s=60, job_id=f"job-{os.getpid()}-{number}")
        except RootInUseError:
            record = None
        barrier.wait()  # both have tried before the winner lets go
        if record is not None:
            won.append(number)
            release_root(storage, record)
        barrier.wait()
    results.put(won)


def test_two_clients_claiming_one_root_one_wins_every_round(two_mounts: TwoMounts) -> None:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2, timeout=120), context.Queue()
    procs = [context.Process(target=_claimer, args=(PosixStorage(m, fsync=True), CLAIM_ROUNDS, barrier, results))
             for m in (two_mounts.first, two_mounts.second)]
    for proc in procs:
        proc.start()
    try:
        won = [results.get(timeout=600) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert sorted(won[0] + won[1]) == list(range(CLAIM_ROUNDS)), "one claim wins every round, never two"
    # The last release is seen through the other client once its cache expires (GlusterFS keeps a name for ~1 s).
    deadline = time.monotonic() + 10
    while read_owner(PosixStorage(two_mounts.first)) != (None, None) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert read_owner(PosixStorage(two_mounts.first)) == (None, None) and OWNER_KEY not in os.listdir(two_mounts.first)
