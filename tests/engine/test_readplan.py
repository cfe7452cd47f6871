"""The read plan: every needed block read by exactly one rank, spread over the ranks, sent to the others."""

from __future__ import annotations

import itertools

from ckptio.engine.restore.read_plan import Place, RankReads, StoreLayout, Task, plan_reads, read_shares
from ckptio.format.blocks import split_blocks
from ckptio.format.records import FileRecord

MiB = 1 << 20


def _layout(items: dict[str, tuple[str, int, int]], block: int = 4 * MiB) -> StoreLayout:
    """Items name → (file, raw offset, raw bytes); the item's framing is the 100 bytes before its raw bytes."""
    layout = StoreLayout()
    for name, (file, raw, nbytes) in items.items():
        layout.places[name] = Place(file, raw - 100, nbytes + 200, raw)
        layout.blocks[name] = split_blocks(raw, nbytes, block, "0" * 8 * (-(-nbytes // block)), name)
    return layout


def _reads_of(reads: list[RankReads], world: int) -> dict[int, Task]:
    """Every task of the plan, from the ranks' shares (each task is in its reader's and receivers' shares)."""
    return {t.id: t for r in range(world) for t in reads[r].tasks}


def test_replicated_bytes_are_read_once_spread_and_sent_to_every_other_rank():
    layout = _layout({"a": ("f0", 100, 40 * MiB), "b": ("f0", 40 * MiB + 400, 24 * MiB)})
    needs = [[("a", 100, 100 + 40 * MiB), ("b", 40 * MiB + 400, 64 * MiB + 400)] for _ in range(3)]
    reads = plan_reads(needs, layout, exchange=True)
    tasks = _reads_of(reads, 3)
    covered = sorted((t.offset, t.end) for t in tasks.values())
    assert sum(t.length for t in tasks.values()) == 64 * MiB  # each byte once
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(covered))  # no overlap
    per_reader = [sum(t.length for t in tasks.values() if t.reader == r) for r in range(3)]
    assert max(per_reader) - min(per_reader) <= 16 * MiB  # within one task of even
    for t in tasks.values():
        assert set(t.receivers) == {0, 1, 2} - {t.reader}
        assert t.length <= 16 * MiB and t.gapless  # one item per task: it can land in the target
    for r in range(3):  # every rank takes part in every task, in id order
        assert [t.id for t in reads[r].tasks] == sorted(tasks)


def test_sharded_bytes_are_read_by_their_own_rank_only():
    layout = _layout({f"s{r}": (f"f{r}", 100, 8 * MiB) for r in range(4)})
    needs = [[(f"s{r}", 100, 100 + 8 * MiB)] for r in range(4)]
    reads = plan_reads(needs, layout, exchange=True)
    for r in range(4):
        assert reads[r].tasks and all(t.reader == r and not t.receivers for t in reads[r].tasks)


def test_a_need_boundary_inside_a_block_makes_a_task_of_its_own():
    layout = _layout({"w": ("f", 100, 16 * MiB)})
    half = 100 + 8 * MiB + 1000  # inside the third 4 MiB block
    needs = [[("w", 100, half)], [("w", half, 100 + 16 * MiB)]]
    tasks = _reads_of(plan_reads(needs, layout, exchange=True), 2)
    shared = [t for t in tasks.values() if t.receivers]
    assert len(shared) == 1 and shared[0].offset == 100 + 8 * MiB and shared[0].length == 4 * MiB
    assert sum(t.length for t in tasks.values()) == 16 * MiB


def test_small_items_share_tasks_and_files_without_block_checksums_are_one_task():
    layout = _layout({f"t{i}": ("f", 1000 * i + 100, 800) for i in range(50)})
    layout.whole_files["old"] = FileRecord(name="old", size=12345, crc32c="00000000")
    layout.places["legacy"] = Place("old", 0, 12345)
    needs = [[(f"t{i}", 1000 * i + 100, 1000 * i + 900) for i in range(50)] + [("legacy", 0, 12345)]]
    (only,) = plan_reads(needs, layout, exchange=True)
    assert len(only.tasks) == 2
    packed, whole = sorted(only.tasks, key=lambda t: t.file)
    assert (packed.file, packed.offset, packed.end, len(packed.blocks)) == ("f", 100, 49 * 1000 + 900, 50)
    assert (whole.file, whole.offset, whole.length) == ("old", 0, 12345)


def test_without_exchange_every_needer_reads_for_itself():
    layout = _layout({"a": ("f", 100, 8 * MiB)})
    needs = [[("a", 100, 100 + 8 * MiB)] for _ in range(2)]
    reads = plan_reads(needs, layout, exchange=False)
    for r in range(2):
        assert sum(t.length for t in reads[r].tasks) == 8 * MiB
        assert all(t.reader == r and not t.receivers for t in reads[r].tasks)


def test_only_allowed_readers_read_a_file():
    layout = _layout({"a": ("f", 100, 32 * MiB)})
    needs = [[("a", 100, 100 + 32 * MiB)] for _ in range(4)]
    tasks = _reads_of(plan_reads(needs, layout, exchange=True, readers_of=lambda name: [2, 3]), 4)
    assert {t.reader for t in tasks.values()} == {2, 3}


def test_read_shares_prices_a_layout_for_the_planner():
    replicated = read_shares([(64 * MiB, frozenset({0, 1, 2, 3}))], 4)
    assert sum(replicated.read) == 64 * MiB and max(replicated.read) == 16 * MiB
    assert replicated.sent == [48 * MiB] * 4 and replicated.received == [48 * MiB] * 4
    sharded = read_shares([(8 * MiB, frozenset({r})) for r in range(4)], 4)
    assert sharded.read == [8 * MiB] * 4 and sharded.sent == [0] * 4
    alone = read_shares([(64 * MiB, frozenset({0, 1}))], 2, exchange=False)
    assert alone.read == [64 * MiB, 64 * MiB]


def _shares_one_chunk_at_a_time(regions, world, *, exchange, chunk, readers):  # type: ignore[no-untyped-def]
    """read_shares as first written: every chunk picked with ``_Load.pick``, every receiver counted one by one."""
    from ckptio.engine.restore.read_plan import _Load

    load = _Load([0] * world)
    read, sent, received = [0] * world, [0] * world, [0] * world
    for i, (nbytes, needers) in enumerate(regions):
        for start in range(0, nbytes, chunk):
            length = min(chunk, nbytes - start)
            for owners in ([set(needers)] if exchange else [{r} for r in sorted(needers)]):
                reader = load.pick(owners, readers.get(i) if readers and exchange else None)
                load.bytes[reader] += length
                read[reader] += length
                for r in owners - {reader}:
                    sent[reader] += length
                    received[r] += length
    return read, sent, received


def test_read_shares_picks_the_readers_plan_reads_picks_one_chunk_at_a_time():
    """The heap is an optimization only: on random layouts (uneven regions, overlapping needers, limited readers)
    every rank's read, sent and received bytes equal a chunk-by-chunk walk with the engine's own pick."""
    import random

    rng = random.Random(7)
    for case in range(200):
        world = rng.randint(1, 9)
        regions = [(rng.choice([0, 1, 5, 16, 17, 40, 64]) * MiB + rng.randint(0, 3),
                    frozenset(rng.sample(range(world), rng.randint(1, world)))) for _ in range(rng.randint(1, 12))]
        readers = {i: sorted(rng.sample(range(world), rng.randint(1, world)))
                   for i in range(len(regions)) if rng.random() < 0.3}
        for exchange in (True, False):
            got = read_shares(regions, world, exchange=exchange, chunk=16 * MiB, readers=readers)
            want = _shares_one_chunk_at_a_time(regions, world, exchange=exchange, chunk=16 * MiB, readers=readers)
            assert (got.read, got.sent, got.received) == want, (case, exchange, regions, readers)
