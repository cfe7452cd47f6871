"""One job per root: the heartbeat is a compare-and-swap, a replaced owner stops, and a record that cannot be
honoured (future heartbeat, absurd lease) is a named error that says how to clear it. POSIX and moto S3."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator

import pytest
import torch

import ckptio
from ckptio import format as fmt
from ckptio.engine.owner_record import (
    OWNER_KEY,
    OwnerRecord,
    claim_root,
    ensure_lease,
    heartbeat,
    read_owner,
    release_root,
)
from ckptio.errors import ConfigError, RootInUseError
from ckptio.storage import Storage, open_storage
from ckptio.storage.base import Data, ObjectInfo, Pacer, PutMode
from ckptio.storage.storage_wrapper import StorageWrapper

_LEASE = 0.3


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def root_url(kind: str, tmp_path, request: pytest.FixtureRequest) -> str:
    if kind == "posix":
        path = tmp_path / "ckpt"
        path.mkdir()
        return str(path)
    make_bucket: Callable[..., str] = request.getfixturevalue("make_bucket")
    return f"s3://{make_bucket()}/run"


@pytest.fixture
def storage(root_url: str) -> Iterator[Storage]:
    store = open_storage(root_url)
    yield store
    store.close()


def _expire(record: OwnerRecord) -> None:
    time.sleep(record.lease_s * 1.5)


def test_a_replaced_owner_stops_at_its_next_heartbeat_and_never_overwrites_its_successor(storage: Storage) -> None:
    first = claim_root(storage, lease_s=_LEASE, job_id="first")
    _expire(first)  # paused past its lease: another job may take the root
    second = claim_root(storage, lease_s=60, job_id="second")
    with pytest.raises(RootInUseError, match="second"):
        heartbeat(storage, first)
    with pytest.raises(RootInUseError, match="lost its claim"):
        ensure_lease(storage, first)  # what the committer calls before a manifest
    current, _ = read_owner(storage)
    assert current is not None and current.job_id == "second" and current.claim == second.claim
    release_root(storage, first)  # the old owner's close() must not free its successor's root
    assert storage.exists(OWNER_KEY)
    heartbeat(storage, second)
    ensure_lease(storage, second)
    release_root(storage, second)
    assert not storage.exists(OWNER_KEY)


def test_a_restart_with_the_same_job_id_takes_over_and_the_old_claim_stops(storage: Storage) -> None:
    old = claim_root(storage, lease_s=60, job_id="job-7")
    new = claim_root(storage, lease_s=60, job_id="job-7")  # takeover at once, lease or not
    with pytest.raises(RootInUseError):
        heartbeat(storage, old)
    heartbeat(storage, new)
    assert read_owner(storage)[0] == new


def test_an_owner_whose_beats_lapsed_renews_before_committing_when_nobody_took_over(storage: Storage) -> None:
    mine = claim_root(storage, lease_s=_LEASE, job_id="mine")
    before = mine.heartbeat
    _expire(mine)
    ensure_lease(storage, mine)  # nobody replaced the record: the swap renews it
    current, _ = read_owner(storage)
    assert current is not None and current.claim == mine.claim and current.heartbeat > before
    # A second renewal swaps against the etag the first one returned.
    heartbeat(storage, mine)
    assert read_owner(storage)[0] == mine


class _AnswerAfterSuccessor(StorageWrapper):
    """The owner record's next write lands, then its answer comes back only after the lease ran out and another
    job claimed the root: a writer paused (SIGSTOP, a VM stall) while its heartbeat was in flight."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.armed = False
        self.successor: OwnerRecord | None = None

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        info = self.inner.put(key, data, mode=mode, pacer=pacer)
        if self.armed and key == OWNER_KEY:
            self.armed = False
            time.sleep(_LEASE * 1.5)
            self.successor = claim_root(self.inner, lease_s=60, job_id="successor")
        return info


def test_a_heartbeat_answered_after_a_successor_claimed_does_not_let_the_old_owner_commit(storage: Storage) -> None:
    """The old owner's heartbeat reads success (its write did land), but the lease counts from when it was sent:
    before a manifest, ensure_lease swaps again, finds the successor and refuses."""
    slow = _AnswerAfterSuccessor(storage)
    old = claim_root(slow, lease_s=_LEASE, job_id="old")
    slow.armed = True
    heartbeat(slow, old)
    assert slow.successor is not None
    with pytest.raises(RootInUseError, match="successor"):
        ensure_lease(slow, old)
    current, _ = read_owner(storage)
    assert current is not None and current.claim == slow.successor.claim


def test_a_deleted_record_is_taken_back_by_its_owner(storage: Storage) -> None:
    mine = claim_root(storage, lease_s=60, job_id="mine")
    storage.delete(OWNER_KEY)
    heartbeat(storage, mine)
    assert read_owner(storage)[0] == mine


def _forge(storage: Storage, **fields: object) -> None:
    record = {"job_id": "ghost", "host": "another-host.invalid", "pid": 1, "heartbeat": time.time(), "lease_s": 60.0,
              "claim": "x"}
    record.update(fields)
    storage.put(OWNER_KEY, json.dumps(record).encode())


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"heartbeat": time.time() + 10 * 365 * 86400}, "in the future"),
        ({"lease_s": 1e9}, "lease_s"),
        ({"lease_s": -5}, "lease_s"),
        ({"lease_s": math.inf}, "lease_s"),
        ({"heartbeat": math.nan}, "heartbeat"),
    ],
)
def test_an_implausible_record_is_a_named_error_that_says_how_to_clear_it(
    storage: Storage, fields: dict[str, object], what: str
) -> None:
    assert socket.gethostname() != "another-host.invalid"
    _forge(storage, **fields)
    with pytest.raises(RootInUseError, match=what) as info:
        claim_root(storage, lease_s=60, job_id="me")
    message = str(info.value)
    assert OWNER_KEY in message and "delete" in message and "job_id='ghost'" in message
    # Both ways out work: the named takeover ...
    mine = claim_root(storage, lease_s=60, job_id="ghost")
    assert read_owner(storage)[0] == mine
    # ... and deleting the file.
    _forge(storage, **fields)
    storage.delete(OWNER_KEY)
    assert claim_root(storage, lease_s=60, job_id="me").job_id == "me"


def test_a_record_of_a_dead_process_on_this_host_is_free_whatever_it_says(storage: Storage) -> None:
    _forge(storage, host=socket.gethostname(), pid=2**22 + 12345, heartbeat=time.time() + 1e9)
    assert claim_root(storage, lease_s=60, job_id="me").job_id == "me"


def test_a_file_that_is_no_owner_record_is_replaced(storage: Storage) -> None:
    storage.put(OWNER_KEY, b"\x00\xffnot json")
    assert claim_root(storage, lease_s=60, job_id="me").job_id == "me"
    storage.put(OWNER_KEY, json.dumps({"job_id": 3, "heartbeat": "soon"}).encode())
    assert claim_root(storage, lease_s=60, job_id="me2").job_id == "me2"


@pytest.mark.parametrize("lease_s", [1e9, math.inf, math.nan, -1.0])
def test_claiming_with_an_absurd_lease_is_a_config_error(storage: Storage, lease_s: float) -> None:
    with pytest.raises(ConfigError, match="lease_s"):
        claim_root(storage, lease_s=lease_s)
    assert not storage.exists(OWNER_KEY)


def test_a_paused_writer_that_lost_the_root_fails_its_save_and_commits_nothing(root_url: str) -> None:
    """SIGSTOP the rank-0 writer past its lease, let another job claim the root, resume: the next save fails with
    RootInUseError, no manifest is written, and the successor's record survives the old job's close()."""
    ck = ckptio.Checkpointer(root_url, lease_s=1.0, job_id="paused")
    store = open_storage(root_url)
    try:
        ck.save(1, {"w": torch.ones(4)}).wait(timeout=120)
        pid = ck._writer.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(1.6)
            successor = claim_root(store, lease_s=60, job_id="successor")
        finally:
            os.kill(pid, signal.SIGCONT)
        with pytest.raises(RootInUseError, match="successor"):
            ck.save(2, {"w": torch.full((4,), 2.0)}).wait(timeout=120)
        assert not store.exists(fmt.manifest_key(2))
        assert fmt.committed_steps(store) == [1]
    finally:
        with contextlib.suppress(RootInUseError):
            ck.close()
    current, _ = read_owner(store)
    assert current is not None and current.claim == successor.claim
    store.close()
