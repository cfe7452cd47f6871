"""The owner record judges a holder's pid only on the holder's own machine (boot id and pid namespace), never by
hostname alone: two nodes or containers may share a name, and then a live job elsewhere must keep its root."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from ckptio._proc import machine_id
from ckptio.engine.owner_record import OWNER_KEY, claim_root, read_owner
from ckptio.errors import RootInUseError
from ckptio.storage import PosixStorage

DEAD_PID = 2**22 + 12345


def _forge(storage: PosixStorage, **fields: object) -> None:
    record = {"job_id": "other", "host": socket.gethostname(), "pid": DEAD_PID, "heartbeat": time.time(),
              "lease_s": 60.0, "claim": "x"}
    record.update(fields)
    storage.put(OWNER_KEY, json.dumps(record).encode())


def test_a_claim_records_its_machine(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    mine = claim_root(storage, lease_s=60, job_id="me")
    assert mine.machine == machine_id() != ""
    assert read_owner(storage)[0] == mine


def test_same_hostname_on_another_machine_keeps_the_root_for_its_lease(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    _forge(storage, machine="another-boot-id/4026531836")
    with pytest.raises(RootInUseError, match="another job"):
        claim_root(storage, lease_s=60, job_id="me")


def test_a_dead_process_on_this_machine_frees_the_root_at_once(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    _forge(storage, machine=machine_id(), host="a-name-this-host-does-not-have")
    assert claim_root(storage, lease_s=60, job_id="me").job_id == "me"


def test_a_record_with_a_bad_machine_field_is_no_record(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    _forge(storage, machine=42)
    assert read_owner(storage)[0] is None
    assert claim_root(storage, lease_s=60, job_id="me").job_id == "me"
