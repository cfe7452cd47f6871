"""The plan of a restore's early pushes (engine/restore/early_push.py): which of a lost node's files are pushed back
to it, from where and to whom, derived alike on every rank from the nodes' holdings. Pure functions: the pushes
themselves run in the two-level jobs of test_two_levels.py."""

from __future__ import annotations

from pathlib import Path

from ckptio.engine.restore.early_push import PUSH_TAG_BASE, Push, node_holdings, plan_pushes
from ckptio.format.local_level_records import own_copy_key, partner_copy_key
from ckptio.storage import open_storage

MiB = 1 << 20
CAP = 64 * MiB


def _file(rank: int) -> str:
    return f"__{rank}_0-{rank:013x}.distcp"


def test_nothing_is_pushed_when_every_node_holds_its_own_files():
    reports = {"n0": {5: [(_file(0), True, MiB), (_file(1), False, MiB)]},
               "n1": {5: [(_file(1), True, MiB), (_file(0), False, MiB)]}}
    assert plan_pushes(reports, ["n0", "n1"], cap_bytes=CAP) == []


def test_a_lost_nodes_files_go_from_the_first_holder_to_the_ranks_that_wrote_them():
    # n1 (ranks 2, 3) came back empty; n0 keeps its partner copies, and n2 a second copy of rank 3's file.
    reports = {"n0": {5: [(_file(0), True, MiB), (_file(1), True, MiB), (_file(2), False, MiB),
                          (_file(3), False, 2 * MiB)]},
               "n1": {},
               "n2": {5: [(_file(4), True, MiB), (_file(3), False, 2 * MiB)]}}
    nodes = ["n0", "n0", "n1", "n1", "n2"]
    assert plan_pushes(reports, nodes, cap_bytes=CAP) == [
        Push(5, _file(2), MiB, sender=0, receiver=2, tag=PUSH_TAG_BASE),
        Push(5, _file(3), 2 * MiB, sender=0, receiver=3, tag=PUSH_TAG_BASE + 1)]


def test_only_the_newest_step_with_partner_copies_and_only_files_nobody_holds_as_their_own():
    reports = {"n0": {4: [(_file(1), False, MiB)], 5: [(_file(1), False, MiB)],
                      6: [(_file(0), True, MiB)]},  # 6: a save whose copies never went out (not committed)
               "n1": {5: [(_file(1), True, MiB)]}}  # n1 kept its disk
    assert plan_pushes(reports, ["n0", "n1"], cap_bytes=CAP) == []
    reports["n1"] = {}
    assert [(p.step, p.name) for p in plan_pushes(reports, ["n0", "n1"], cap_bytes=CAP)] == [(5, _file(1))]


def test_a_node_that_keeps_any_copy_of_its_file_is_not_sent_one():
    reports = {"n0": {5: [(_file(1), False, MiB)]}, "n1": {5: [(_file(1), False, MiB)]}}
    assert plan_pushes(reports, ["n0", "n1"], cap_bytes=CAP) == []


def test_files_of_ranks_the_job_lacks_foreign_names_and_empty_files_are_not_pushed():
    reports = {"n0": {5: [(_file(7), False, MiB), ("notes.txt", False, MiB), (_file(1), False, 0)]}, "n1": {}}
    assert plan_pushes(reports, ["n0", "n1"], cap_bytes=CAP) == []


def test_each_rank_sends_and_receives_at_most_the_cap():
    # rank 1 wrote three files of 30 MiB: two fit under a 64 MiB cap; the third is left to DCP's read.
    names = [f"__1_{n}-{1:013x}.distcp" for n in range(3)]
    reports = {"n0": {5: [(name, False, 30 * MiB) for name in names]}, "n1": {}}
    pushes = plan_pushes(reports, ["n0", "n1"], cap_bytes=CAP)
    assert [p.name for p in pushes] == names[:2]
    assert sum(p.size for p in pushes) <= CAP


def test_a_nodes_holdings_are_its_own_and_partner_copies_per_step_without_temporary_files(tmp_path: Path):
    local = open_storage(str(tmp_path))
    local.put(own_copy_key(5, _file(0)), b"x" * 10)
    local.put(partner_copy_key(5, _file(1)), b"y" * 7)
    local.put(partner_copy_key(3, _file(1)), b"z")
    (tmp_path / "partners" / "step-00000005" / ".tmp-half").write_bytes(b"half")
    assert node_holdings(local) == {5: [(_file(0), True, 10), (_file(1), False, 7)], 3: [(_file(1), False, 1)]}
