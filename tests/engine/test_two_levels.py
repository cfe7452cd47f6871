"""Two levels with real failures on one machine: real gloo ranks as separate processes, "nodes" placed
with ``node_id`` (each with its own local dir), real kill -9 of a whole node (ranks and writers), real SIGTERM.

The base job trains 5 steps with ``durable_every=2``: durable steps 2 and 4, local-level steps 1..5 (own node +
one partner node). Scenarios then damage copies of that job's directories and relaunch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ckptio.format import RankIndex, committed_steps, index_key, manifest_key, read_manifest
from ckptio.format.local_level_records import local_records, partner_copy_key
from ckptio.storage import open_storage
from ckptio.testing.ranks import ScriptProcess, free_port, start_script
from tests.engine.forge import forge_floats

JOB = os.path.join(os.path.dirname(__file__), "two_level_job.py")
pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


class Job:
    """One launch: ``world`` rank processes, rank r on node ``nodes[r]``, each in its own process group (forked
    from the rank fork server: a fresh interpreter each would import torch again, ~2 CPU-seconds per rank)."""

    def __init__(self, base: Path, nodes: list[str], mode: str, *, steps: int = 0, durable_every: int = 2,
                 **extra: Any) -> None:
        port = free_port()
        self.procs: list[ScriptProcess] = []
        for rank, node in enumerate(nodes):
            spec = {"root": str(base / "root"), "local": str(base / f"local-{node}"), "node": node, "mode": mode,
                    "steps": steps, "durable_every": durable_every, **extra}
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(nodes)), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), CKPTIO_PARTNER_HOST="127.0.0.1")
            self.procs.append(start_script(JOB, [json.dumps(spec)], env=env, new_session=True))

    def line(self, rank: int, key: str, timeout: float = 120.0) -> dict[str, Any]:
        """The next JSON line of ``rank`` that has ``key`` (others are skipped)."""
        proc = self.procs[rank]
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = proc.stdout.readline()
            if not raw:
                raise AssertionError(f"rank {rank} exited ({proc.wait()}) before printing {key!r}")
            if raw.startswith("{"):
                record = json.loads(raw)
                if key in record:
                    return record
        raise AssertionError(f"rank {rank}: no {key!r} within {timeout} s")

    def kill(self, ranks: list[int]) -> None:
        for r in ranks:  # trainer and its writer share the process group: kill -9 the whole "node"
            os.killpg(self.procs[r].pid, signal.SIGKILL)
        for r in ranks:
            self.procs[r].wait()
            self._close(r)

    def _close(self, rank: int) -> None:
        if self.procs[rank].stdout is not None:
            self.procs[rank].stdout.close()

    def wait(self, timeout: float = 120.0) -> list[int]:
        codes = [p.wait(timeout=timeout) for p in self.procs]
        for r in range(len(self.procs)):
            self._close(r)
        return codes


NODES4 = ["n0", "n0", "n1", "n1"]  # 2 ranks x 2 nodes
NODES2 = ["n0", "n1"]


def _train_then_lose_node(base: Path, nodes: list[str], lost: tuple[str, ...] = ("n1",), **extra: Any) -> None:
    job = Job(base, nodes, "hang", steps=5, **extra)
    for r in range(len(nodes)):
        assert job.line(r, "done")["done"] == 5
    job.kill([r for r, n in enumerate(nodes) if n in lost])  # the lost nodes die with their writers
    job.kill([r for r, n in enumerate(nodes) if n not in lost])  # the launcher tears the job down
    for node in lost:
        shutil.rmtree(base / f"local-{node}")  # and they come back with empty local disks
    root = open_storage(str(base / "root"))
    assert committed_steps(local_records(root))[-1] == 5


def _relaunch(base: Path, nodes: list[str], **extra: Any) -> list[dict[str, Any]]:
    job = Job(base, nodes, "exit", **extra)
    lines = [job.line(r, "restored") for r in range(len(nodes))]
    assert job.wait() == [0] * len(nodes)
    return lines


@pytest.fixture(scope="module")
def two_rank_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("two-rank-base")
    _train_then_lose_node(base, NODES2)
    return base


def test_node_loss_restores_from_partners_bit_exact_newer_than_durable(tmp_path):
    _train_then_lose_node(tmp_path, NODES4)
    lines = _relaunch(tmp_path, NODES4)
    manifest = read_manifest(local_records(open_storage(str(tmp_path / "root"))), 5)
    for r, line in enumerate(lines):
        assert line["restored"] == 5 and line["ok"], line  # newer than the newest durable step (4), bit-exact
        assert line["last_restore"]["level"] == "local"
        if NODES4[r] == "n1":  # its own copies are gone: every file came over the network from n0
            assert set(line["last_restore"]["sources"]) == {"partner"}, line
            # n0 pushed each of n1's files to the rank that wrote it, before the step was even chosen; that rank
            # held the copy to its digest once (hashed as its pieces landed), in the background before DCP's
            # planning (the first read waits for the outcome, it does not check again).
            (mine,) = [n for n in manifest.files if n.startswith(f"__{r}_")]
            assert line["partner_checks"] == [[mine, "ckptio-partner-check"]], line
            copy = tmp_path / "local-n1" / partner_copy_key(5, mine)
            assert copy.read_bytes() == (tmp_path / "local-n0" / partner_copy_key(5, mine)).read_bytes()
        else:
            assert set(line["last_restore"]["sources"]) == {"local"}, line
            assert line["partner_checks"] == [], line  # n0 sent n1's files on; n1 reads and checks them


def test_three_nodes_with_two_replicas_survive_losing_two_nodes(tmp_path):
    # Partners are the same local rank on the next nodes: with replicas=2 on 3 nodes every node holds a copy of
    # every other's shards, so n0 alone still holds all of step 5.
    nodes = ["n0", "n1", "n2"]
    _train_then_lose_node(tmp_path, nodes, lost=("n1", "n2"), replicas=2)
    lines = _relaunch(tmp_path, nodes, replicas=2)
    for r, line in enumerate(lines):
        assert line["restored"] == 5 and line["ok"], line  # newer than the newest durable step (4), bit-exact
        assert line["last_restore"]["level"] == "local"
        if r == 0:  # its own file from its disk; a range of a lost rank's file it also needs may come from
            # that rank, which holds the copy n0 pushed to it (read once, by whichever needer the plan picks)
            assert "local" in line["last_restore"]["sources"], line
        else:  # n0 pushed each lost rank's file to it before the step was chosen
            assert set(line["last_restore"]["sources"]) == {"partner"}, line


def test_node_and_partner_lost_restores_from_durable(two_rank_base, tmp_path):
    base = tmp_path / "b"
    shutil.copytree(two_rank_base, base)
    shutil.rmtree(base / "local-n0")  # n1's only partner is gone too
    for line in _relaunch(base, NODES2):
        assert line["restored"] == 4 and line["ok"] and line["last_restore"]["level"] == "durable", line
        assert "held on no node" in line["last_restore"]["note"]


def test_corrupt_partner_copy_restores_from_durable(two_rank_base, tmp_path):
    base = tmp_path / "c"
    shutil.copytree(two_rank_base, base)
    manifest = read_manifest(local_records(open_storage(str(base / "root"))), 5)
    (name,) = [n for n in manifest.files if n.startswith("__1_")]  # rank 1's (node n1's) file
    copy = base / "local-n0" / partner_copy_key(5, name)
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    copy.write_bytes(bytes(data))
    for line in _relaunch(base, NODES2):
        assert line["restored"] == 4 and line["ok"] and line["last_restore"]["level"] == "durable", line
        assert "failed its checks" in line["last_restore"]["note"]
    # n0 pushed the corrupt copy to rank 1, which refused it as it landed: nothing was kept on n1.
    assert not (base / "local-n1" / partner_copy_key(5, name)).exists()


def _events(path: str, rank: int) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(path.format(rank=rank)).read_text().splitlines()]


def test_a_stopped_partner_costs_the_training_thread_nothing(tmp_path):
    """Rank 1's writer (and its partner server) is stopped for three saves: rank 0's copies to it fail in the
    background, rank 0's job pipeline goes on to the next save meanwhile, and every save still commits."""
    events = str(tmp_path / "events-{rank}.jsonl")
    job = Job(tmp_path, NODES2, "unreachable", durable_every=100, partner_timeout_s=3.0, events=events)
    assert job.line(0, "returned")["returned"] == 4
    assert job.line(0, "done")["done"] == 5 and job.line(1, "done")["done"] == 5  # every handle waited without error
    assert job.wait() == [0, 0]
    assert committed_steps(local_records(open_storage(str(tmp_path / "root")))) == [5]  # the newest is kept
    for node in NODES2:  # no copy of an older step and no half-received copy is left on either node
        partners = tmp_path / f"local-{node}" / "partners"
        assert sorted(p.name for p in partners.iterdir()) in ([], ["step-00000005"]) if partners.exists() else True
        assert not list((tmp_path / f"local-{node}").rglob(".tmp-*"))
    records = _events(events, 0)
    failed = [i for i, r in enumerate(records) if r["event"] == "replica_failed" and r["step"] == 2]
    assert failed and records[failed[0]]["partner"] == 1, records
    # The next save's files were written before the copy of step 2 gave up: the copy ran beside the job pipeline,
    # not in it (in it, every later save waited for the timeout, and with one slot so did the training thread).
    wrote_3 = [i for i, r in enumerate(records) if r["event"] == "phase" and r["phase"] == "local_write"
               and r["step"] == 3]
    assert wrote_3 and wrote_3[0] < failed[0], [(r["event"], r["step"], r.get("phase")) for r in records]


def test_same_step_saved_twice_on_the_local_level_holds_the_later_state(tmp_path):
    job = Job(tmp_path, NODES2, "twice", steps=2, durable_every=100)
    assert [job.line(r, "done")["done"] for r in range(2)] == [2, 2]
    assert job.wait() == [0, 0]
    for line in _relaunch(tmp_path, NODES2, durable_every=100, expect_variant=1):
        assert line["restored"] == 2 and line["ok"] and line["last_restore"]["level"] == "local", line


def test_rollback_retires_the_abandoned_local_steps(tmp_path):
    """Run 1 saves 1..5 (step 3 durable); run 2 restores step 3 and saves 4; run 3 resumes from 4, not 5."""
    job = Job(tmp_path, NODES2, "exit", steps=5, durable_every=3)
    assert [job.line(r, "done")["done"] for r in range(2)] == [5, 5]
    assert job.wait() == [0, 0]
    job = Job(tmp_path, NODES2, "exit", steps=1, durable_every=3, restore_step=3)
    assert [job.line(r, "restored")["restored"] for r in range(2)] == [3, 3]
    assert [job.line(r, "done")["done"] for r in range(2)] == [4, 4]
    assert job.wait() == [0, 0]
    for line in _relaunch(tmp_path, NODES2, durable_every=3):
        assert line["restored"] == 4 and line["ok"] and line["last_restore"]["level"] == "local", line


def test_mismatch_is_named_and_a_world_size_change_saves_again(tmp_path):
    """A 2-rank job's steps (durable 2 and 4, local 5): a state with an extra key is a StructureMismatchError
    naming the key (no fallback to another copy or an older step); one rank then restores the durable step 4
    and saves step 5 again (superseding the 2-rank local step 5), and the next run resumes from it."""
    job = Job(tmp_path, NODES2, "exit", steps=5)
    assert [job.line(r, "done")["done"] for r in range(2)] == [5, 5]
    assert job.wait() == [0, 0]
    job = Job(tmp_path, NODES2, "mismatch")
    for r in range(2):
        line = job.line(r, "restore_error")
        assert line["restore_error"] == "StructureMismatchError" and "extra" in line["error"], line
    assert job.wait() == [0, 0]
    job = Job(tmp_path, ["n0"], "exit", steps=1, replicas=0)
    line = job.line(0, "restored")
    assert line["restored"] == 4 and line["last_restore"]["level"] == "durable", line
    assert "saved by 2 ranks" in line["last_restore"]["note"]
    assert job.line(0, "done")["done"] == 5
    assert job.wait() == [0]
    (line,) = _relaunch(tmp_path, ["n0"], replicas=0)
    assert line["restored"] == 5 and line["ok"] and line["last_restore"]["level"] == "local", line


def test_sigterm_saves_to_the_local_level_and_resumes_from_that_step(tmp_path):
    job = Job(tmp_path, NODES2, "sigterm", durable_every=1000)
    for r in range(2):
        job.line(r, "saved")
        job.line(r, "saved")
    for proc in job.procs:
        os.kill(proc.pid, signal.SIGTERM)  # the trainer only: a scheduler's preemption notice
    assert job.wait() == [0, 0]  # exited cleanly
    root = open_storage(str(tmp_path / "root"))
    saved = committed_steps(local_records(root))[-1]
    lines = _relaunch(tmp_path, NODES2)
    for line in lines:
        assert line["restored"] == saved and line["ok"] and line["last_restore"]["level"] == "local", line


def test_sigterm_with_save_calls_saves_to_the_local_level_and_exits(tmp_path):
    job = Job(tmp_path, NODES2, "sigterm-save", durable_every=1000)
    for r in range(2):
        job.line(r, "saved")
    for proc in job.procs:
        os.kill(proc.pid, signal.SIGTERM)
    assert job.wait() == [0, 0]
    saved = committed_steps(local_records(open_storage(str(tmp_path / "root"))))[-1]
    for line in _relaunch(tmp_path, NODES2):
        assert line["restored"] == saved and line["ok"] and line["last_restore"]["level"] == "local", line


@pytest.mark.parametrize(("signals", "grace"), [(1, 2.0), (2, 600.0)], ids=["grace-runs-out", "second-sigterm"])
def test_sigterm_without_a_save_call_ends_the_process_as_sigterm_does(tmp_path, signals, grace):
    """No save call comes (evaluation, data preparation): the process dies of SIGTERM once the grace period ran
    out, or at once on a second SIGTERM after the duplicate window (a 600 s grace would outlast the wait below)."""
    job = Job(tmp_path, ["n0"], "sigterm-idle", replicas=0, grace=grace, window=1.0)
    job.line(0, "saved")
    for _ in range(signals):
        os.kill(job.procs[0].pid, signal.SIGTERM)
        time.sleep(1.5)
    assert job.wait(timeout=60) == [-signal.SIGTERM]


# ---- the partner channel against a hostile network ---------------------------------------------------------


def _drain(sock: socket.socket) -> bytes:
    received = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := sock.recv(1 << 16):
            received += chunk
    return received


def test_a_plain_client_gets_nothing_from_a_real_writer(tmp_path):
    job = Job(tmp_path, NODES2, "hang", steps=3)  # step 3: local only, so wait() covers its local commit
    try:
        ports = [job.line(r, "done")["partner_port"] for r in range(2)]
        manifest = read_manifest(local_records(open_storage(str(tmp_path / "root"))), 3)
        name = next(n for n in manifest.files if n.startswith("__0_"))
        data = (tmp_path / "local-n0" / "step-00000003" / name).read_bytes()
        get = json.dumps({"op": "get", "step": 3, "name": name}).encode()
        put = json.dumps({"op": "put", "step": 3, "name": "__9_0-1.distcp", "size": len(data),
                          "crc32c": manifest.files[name].crc32c}).encode()
        for request in (len(get).to_bytes(4, "big") + get, len(put).to_bytes(4, "big") + put + data):
            with socket.create_connection(("127.0.0.1", ports[0]), timeout=30) as sock:
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                    sock.sendall(request)
                assert _drain(sock) == b""  # the writer hangs up: no header, no byte of the shard
        # os.walk, not rglob: the job's retention removes older steps' directories while this looks (rglob
        # raises on a directory that vanishes under it; os.walk skips it)
        assert not [f for _, _, files in os.walk(tmp_path) for f in files if f == "__9_0-1.distcp"]
    finally:
        job.kill([0, 1])


def _forge_rank1_file(base: Path, where: Path) -> str:
    """Forge rank 1's data file of step 5 at ``where``/partners: 16 of its weights set to 1e6, size and crc32c
    kept. Returns the file name."""
    records = local_records(open_storage(str(base / "root")))
    index = RankIndex.from_json(records.get(index_key(5, 1)))
    item = next(i for i in index.items if i.fqn == "w1")
    name = item.file
    intact = base / "local-n0" / partner_copy_key(5, name)  # n0 holds rank 1's partner copy
    data = intact.read_bytes()
    blob = data[item.file_offset:item.file_offset + item.length]  # the tensor as torch.save frames it (a zip)
    record = next(r for r in zipfile.ZipFile(io.BytesIO(blob)).infolist() if r.filename.endswith("/data/0"))
    name_len, extra_len = struct.unpack_from("<HH", blob, record.header_offset + 26)
    raw_at = item.file_offset + record.header_offset + 30 + name_len + extra_len  # the float32 values themselves
    forged = forge_floats(data, raw_at)
    target = where / partner_copy_key(5, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(forged)
    return name


def test_a_forged_copy_with_a_fixed_crc_is_refused_at_restore(two_rank_base, tmp_path):
    # n1 came back empty: rank 1's only copy is n0's partner copy, and someone rewrote it keeping its crc32c.
    base = tmp_path / "f"
    shutil.copytree(two_rank_base, base)
    _forge_rank1_file(base, base / "local-n0")
    for line in _relaunch(base, NODES2):
        assert line["ok"], line  # never the forged weights
        assert line["restored"] == 4 and line["last_restore"]["level"] == "durable", line
        assert "failed its checks" in line["last_restore"]["note"], line


def test_a_forged_copy_in_this_nodes_partner_area_is_passed_over(two_rank_base, tmp_path):
    # n1's partner area holds a forged copy of rank 1's own file: restore passes over it, fetches n0's intact one.
    base = tmp_path / "g"
    shutil.copytree(two_rank_base, base)
    name = _forge_rank1_file(base, base / "local-n1")
    lines = _relaunch(base, NODES2)
    for line in lines:
        assert line["restored"] == 5 and line["ok"] and line["last_restore"]["level"] == "local", line
    assert lines[1]["last_restore"]["sources"] == {"partner": 1}, lines[1]
    assert (base / "local-n1" / partner_copy_key(5, name)).read_bytes() == \
        (base / "local-n0" / partner_copy_key(5, name)).read_bytes()  # replaced by the verified copy


def test_records_without_digests_use_no_partner_copy(two_rank_base, tmp_path):
    # A step committed before digests were recorded: its partner copies cannot be authenticated, so a node that
    # lost its own copies restores from the durable level instead.
    base = tmp_path / "h"
    shutil.copytree(two_rank_base, base)
    path = base / "root" / "levels" / "local" / manifest_key(5)
    body = json.loads(path.read_text())
    for rec in body["files"].values():
        rec["digest"] = ""
    path.write_text(json.dumps(body))
    for line in _relaunch(base, NODES2):
        assert line["restored"] == 4 and line["ok"] and line["last_restore"]["level"] == "durable", line


def test_a_staging_copy_that_fails_on_one_rank_of_a_local_only_save_fails_every_rank_fast(tmp_path):
    """Issue 21 item 9: rank 1's staging copy of a local-level-only save fails. Its failure marker must reach the
    local level's records, the only ones rank 0's local committer reads for this save: rank 0's save then fails
    within seconds, not after commit_timeout_s (60 s here). A marker in the durable records only would leave rank 0
    waiting the full minute."""
    job = Job(tmp_path, NODES2, "stage-fails", durable_every=100, commit_timeout_s=60)
    ends = [job.line(r, "outcome", timeout=90) for r in range(2)]
    assert job.wait() == [0, 0]
    assert ends[1]["outcome"] == "UnsupportedStateError" and "injected" in ends[1]["error"], ends
    assert ends[0]["outcome"] == "CommitError" and "another rank failed" in ends[0]["error"], ends
    assert ends[0]["seconds"] < 20, ends  # the marker, not the 60 s commit timeout
    markers = tmp_path / "root" / "levels" / "local" / "step-00000002" / "failed"
    assert [p.name for p in markers.iterdir()] == ["rank1.json"]
    assert not (tmp_path / "root" / "step-00000002").exists()  # the save never went to the durable level
