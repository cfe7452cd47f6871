"""The local tier, the one owner of every deletion in local_dir: eviction after a commit, room for a save (budget
and ENOSPC), a failed attempt's files, and partner copies of steps that never committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptio.engine.writer.live_steps import LiveSteps
from ckptio.engine.writer.local_tier import LocalTier
from ckptio.errors import StorageFullError
from ckptio.format import Manifest, write_manifest
from ckptio.format.local_level_records import local_records, partner_copy_key
from ckptio.storage import open_storage


def _tier(tmp_path: Path, *, budget: int | None = None, live: LiveSteps | None = None) -> LocalTier:
    local = open_storage(str(tmp_path / "local"), fsync=False)
    durable = open_storage(str(tmp_path / "root"), fsync=False)
    return LocalTier(local, durable=durable, local_records=local_records(durable), live=live or LiveSteps(),
                     budget=budget, rank=0)


def _own(tier: LocalTier, step: int, size: int = 100, name: str = "__0_0-0000000000001.distcp") -> None:
    tier.storage.put(f"step-{step:08d}/{name}", b"x" * size)


def _commit(storage, step: int) -> None:
    write_manifest(storage, Manifest(step=step, world_size=1, save_id=step, files={}, total_bytes=0))


def test_a_commit_evicts_older_own_and_partner_copies_but_not_live_steps(tmp_path):
    live = LiveSteps()
    tier = _tier(tmp_path, live=live)
    for step in (1, 2, 3):
        _own(tier, step)
        tier.storage.put(partner_copy_key(step, "__1_0-0000000000001.distcp"), b"p")
    live.add(1)
    tier.evict_below(3, live.steps())
    assert sorted(tier._own_steps()) == [1, 3]  # 1 is being written by a save: never evicted
    assert tier._partner_steps() == [3]


def test_room_for_a_save_takes_superseded_steps_only(tmp_path):
    tier = _tier(tmp_path, budget=250)
    _own(tier, 1)
    _own(tier, 2)
    with pytest.raises(StorageFullError, match="budget exhausted"):
        tier.make_room(3, 100)  # neither 1 nor 2 is superseded: a restore may still need them
    _commit(tier.durable, 1)  # durable now: its local copy is a cache
    tier.make_room(3, 100)
    assert tier._own_steps() == [2]
    with pytest.raises(StorageFullError, match="needs 1,000 bytes of 250"):
        tier.make_room(3, 1000)
    assert tier._own_steps() == [2]  # a hopeless save evicts nothing


def test_a_full_disk_frees_steps_older_than_the_newest_local_commit(tmp_path):
    tier = _tier(tmp_path)
    _own(tier, 1)
    _own(tier, 2)
    assert not tier.free_for(3)
    assert tier.local_records is not None
    _commit(tier.local_records, 2)
    assert tier.free_for(3) and tier._own_steps() == [2]  # 1 is older than the newest local commit; 2 is it


def test_a_failed_attempt_and_uncommitted_partner_copies_leave_through_the_tier(tmp_path):
    tier = _tier(tmp_path)
    _own(tier, 4, name="__0_0-0000000000001.distcp")
    _own(tier, 4, name="__0_0-0000000000002.distcp")
    tier.discard(4, ["__0_0-0000000000002.distcp", "../escape.distcp"])
    assert [i.key for i in tier.storage.list("step-00000004/")] == ["step-00000004/__0_0-0000000000001.distcp"]
    for step in (5, 6):
        tier.storage.put(partner_copy_key(step, "__1_0-0000000000001.distcp"), b"p")
    tier.drop_partner_copies([(5, "__1_0-0000000000001.distcp"), (6, "__1_0-0000000000001.distcp")],
                             committed={6})
    assert tier._partner_steps() == [6]
    assert not (tmp_path / "local" / "partners" / "step-00000005").exists()
