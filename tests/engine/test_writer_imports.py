"""What the writer process imports: no torch at boot on any rank, and none while a rank ≠ 0 serializes a save;
and its priority, lowered before it imports anything of the writer.

torch costs a writer seconds to boot and ~250 MiB of RSS per rank. Rank 0's committer imports it when it builds
``.metadata`` (DCP's classes); every other rank's writer must stay torch-free for its whole life.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time

import torch

from ckptio.config import CheckpointerConfig
from ckptio.engine.protocol import SaveJob, WriterEvent, WriterPlan, WriterStart
from ckptio.engine.trainer.rank_plan import make_planner
from ckptio.engine.trainer.staging_area import StagingArea, copy_into_slot
from ckptio.engine.trainer.writer_proxy import WriterProxy
from ckptio.format.layout import plan_layout
from ckptio.storage import open_storage


def test_writer_entry_point_imports_no_torch():
    code = "import sys, ckptio.engine.writer.process; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_writer_lowers_its_priority_before_it_imports_the_writer():
    # The entry module with a descriptor that is no socket: it takes its priority, imports the writer, then fails
    # on the descriptor. What matters is the priority the import of the writer's code found.
    code = """
import builtins, os, runpy, sys
sys.argv = ["writer", "-1", "5"]
seen = []
real_import = builtins.__import__
def spy(name, *args, **kwargs):
    if name == "ckptio.engine.writer.process" and not seen:
        seen.append(os.getpriority(os.PRIO_PROCESS, 0))
    return real_import(name, *args, **kwargs)
builtins.__import__ = spy
try:
    runpy.run_module("ckptio.engine.writer", run_name="__main__")
except ValueError:  # "invalid handle"
    pass
print(seen[0] - os.getpriority(os.PRIO_PROCESS, os.getppid()) if seen else None)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "5"


def _torch_mapped(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any("libtorch" in line for line in f)


def test_rank1_writer_serializes_a_save_without_torch(root):
    # A real writer process for rank 1 of 2, fed a plan and a staged slot the way the trainer feeds it.
    started = threading.Event()

    def on_message(msg):
        if isinstance(msg, WriterEvent) and msg.record.get("event") == "writer_started":
            started.set()

    # No rank 0 commits this save: the watcher fails it after commit_timeout_s and deletes its files, so the files
    # are read back while it still waits.
    config = CheckpointerConfig(root=root, commit_timeout_s=10.0, writer_nice=0)
    start = WriterStart(config=config.writer_config(), rank=1, world_size=2, durable=open_storage(root), local=None,
                        owner=None)
    proxy = WriterProxy(start, on_message=on_message, on_death=lambda code: None)
    state = {"w": torch.randn(64, 32), "b": torch.randn(5).bfloat16(), "flag": torch.tensor(True),
             "steps": torch.tensor(7)}
    layout = plan_layout(1, make_planner(state, is_coordinator=False).create_local_plan().items, 1 << 30)
    area = StagingArea(1)
    proxy.start()
    try:
        assert started.wait(120), "the writer did not boot"
        assert not _torch_mapped(proxy.pid), "the writer loaded libtorch at boot"
        slot = area.acquire(0, layout)
        copy_into_slot(slot, [state[t.fqn] for t in layout.tensors])
        proxy.send_plan(WriterPlan(1, layout, metadata_skeleton=None))
        proxy.submit(SaveJob(step=3, save_id=11, slot_id=0, slot_path=slot.path, slot_nbytes=slot.nbytes, plan_id=1,
                             objects=()))
        index_path = os.path.join(root, "step-00000003", "ranks", "1.json")
        deadline = time.monotonic() + 120
        while not os.path.exists(index_path):
            assert time.monotonic() < deadline, "the writer wrote no rank index"
            time.sleep(0.05)
        assert not _torch_mapped(proxy.pid), "serializing a save loaded libtorch in a rank-1 writer"
        # What it wrote is what torch.load reads, item by item.
        with open(index_path) as f:
            index = json.load(f)
        blobs = {}
        for item in index["items"]:
            with open(os.path.join(root, "step-00000003", item["file"]), "rb") as f:
                f.seek(item["file_offset"])
                blobs[item["fqn"]] = f.read(item["length"])
    finally:
        proxy.stop()
        area.close()
    for fqn, blob in blobs.items():
        loaded = torch.load(io.BytesIO(blob), weights_only=True)
        assert torch.equal(loaded, state[fqn]), fqn
