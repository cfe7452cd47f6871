"""One rank of the lab's main job (``python lab_rank.py SPEC_JSON``), launched on a lab node by
:func:`ckptio.testing.cluster.jobs.launch_ranks`; it prints JSON lines the driver reads.

Run by file path, not ``-m``: its first line takes the clock before any import, so a resumed rank can say what its
process start, its imports, its process-group init, its ``Checkpointer`` and its restore each cost.

The job: each rank holds ``state_mib`` of model and optimizer tensors (what a save writes) and takes steps of a
little compute and an all-reduce of ``grad_mib`` across the nodes, the traffic that shares each node's link with
partner copies and flushes. Phases (``SPEC["phase"]``):

- ``train``: ``calm_steps`` steps without a save (the clean step and all-reduce times), then ``steps`` steps saving
  every ``every`` with ``saver`` (``ckptio``, ``dcp-best`` or ``none``); then prints ``{"result": ...}`` (per step:
  its time, its all-reduce time, whether a save of this rank was in flight; per save: requested, returned, durable
  wall times) and, with ``hang``, goes on taking steps until it is killed (a node loss).
- ``resume``: build the saver, restore the newest step, take one step, print ``{"resume": ...}`` with the wall
  time of every phase boundary.

It measures only: what the numbers mean is :mod:`ckptio.demo.cluster.figures`'.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before any import: the resume breakdown's "process start" ends here

import json  # noqa: E402 - after the clock, on purpose
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ckptio  # noqa: E402
from ckptio.demo.dcp_best import DcpBest  # noqa: E402

IMPORTED = time.time()


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def make_state(spec: dict[str, Any], rank: int, *, seed: int | None = None) -> dict[str, Any]:
    """This rank's shard of the model weights and two Adam moments, ``state_mib`` in all (ZeRO-3: every rank holds
    its own share).

    Every name carries the rank: plain tensors under one name on every rank are *replicated* for DCP's planner
    (ckptio's and DCP-best's alike), which saves one rank's copy and has every rank restore it, so a job of N ranks
    would write 1/N of the bytes the planner is told and each rank would restore from the other nodes' files.
    Every tensor is random, as a trained model's moments are: MooseFS's client sends no all-zero blocks, so zeros
    would never cross the store's link and every flush and restore would look faster than the link allows.
    ``seed``: other values under the same names (a resumed rank's state, which the restore must overwrite)."""
    n = int(spec["state_mib"] * 2**20 / 4 / 3)
    g = torch.Generator().manual_seed(rank if seed is None else seed)
    return {"model": {f"w{rank}": torch.randn(n, generator=g)},
            "optim": {f"m{rank}": torch.randn(n, generator=g), f"v{rank}": torch.randn(n, generator=g).abs(),
                      f"step{rank}": torch.zeros(1)}}


class Saver:
    """ckptio or DCP-best behind one face: save, wait before the update, durable times, restore, close."""

    def __init__(self, spec: dict[str, Any], rank: int) -> None:
        self.spec, self.rank, self.kind = spec, rank, spec["saver"]
        self.durable: dict[int, float] = {}
        self._pending: Any = None
        self.ck: Any = None
        self.dcp: DcpBest | None = None
        self.group: Any = None
        if self.kind == "ckptio":
            options = {"node_id": os.environ.get("CKPTIO_LAB_NODE"), **spec.get("options", {})}
            self.ck = ckptio.Checkpointer(spec["root"], **options)
        elif self.kind == "dcp-best":
            self.group = dist.new_group(backend="gloo")  # DCP-best's own group: training's all-reduce stays apart
            self.dcp = DcpBest(process_group=self.group)

    def save(self, step: int, state: dict[str, Any]) -> None:
        requested = time.time()
        if self.ck is not None:
            handle = self.ck.save(step, state)
            self._pending = handle
            threading.Thread(target=self._watch_ckptio, args=(step, handle), daemon=True).start()
        elif self.dcp is not None:
            from torch.distributed.checkpoint import FileSystemWriter

            path = os.path.join(self.spec["root"], f"step-{step:08d}")
            response = self.dcp.save(state, FileSystemWriter(path, sync_files=True))
            response.upload_completion.add_done_callback(lambda _f, s=step: self.durable.__setitem__(s, time.time()))
        self.requested_at = requested

    def _watch_ckptio(self, step: int, handle: Any) -> None:
        handle.wait_done()
        self.durable[step] = time.time()

    def before_update(self) -> None:
        if self._pending is not None:
            self._pending.wait_staged()
            self._pending = None
        if self.dcp is not None:
            self.dcp.wait_staged()

    def in_flight(self, saves: list[dict[str, Any]]) -> bool:
        return any(s["step"] not in self.durable for s in saves)

    def restore(self, state: dict[str, Any]) -> dict[str, Any]:
        if self.ck is not None:
            step = self.ck.restore(state)
            report = self.ck.last_restore
            return {"step": step, "level": report.level, "sources": dict(report.sources)}
        import torch.distributed.checkpoint as dcp

        root = self.spec["root"]
        steps = sorted(int(n[5:]) for n in os.listdir(root)
                       if n.startswith("step-") and os.path.exists(os.path.join(root, n, ".metadata")))
        dcp.load(state, checkpoint_id=os.path.join(root, f"step-{steps[-1]:08d}"))
        return {"step": steps[-1], "level": "durable", "sources": {"durable": 1}}

    def close(self) -> None:
        if self.ck is not None:
            self.ck.close()
        if self.dcp is not None:
            self.dcp.close()


class Step:
    """One training step: a little compute, the all-reduce of the gradient, a touch of the state."""

    def __init__(self, spec: dict[str, Any], state: dict[str, Any]) -> None:
        self.grad = torch.ones(int(spec["grad_mib"] * 2**20 / 4))
        self.x = torch.randn(spec.get("compute_n", 192), spec.get("compute_n", 192))
        self.state = state

    def __call__(self, saver: Saver | None) -> tuple[float, float]:
        began = time.perf_counter()
        for _ in range(4):
            self.x = torch.tanh(self.x @ self.x)
        reduce_began = time.perf_counter()
        dist.all_reduce(self.grad)
        reduced = time.perf_counter() - reduce_began
        self.grad.fill_(1.0)
        if saver is not None:
            saver.before_update()
        next(iter(self.state["model"].values()))[:4096].add_(1e-3)
        for name, value in self.state["optim"].items():
            if name.startswith("step"):
                value.add_(1)
        return time.perf_counter() - began, reduced


def train(spec: dict[str, Any], rank: int) -> None:
    """The calm phase, then one saving phase per ``[every, steps]`` of ``SPEC["intervals"]`` (default: ``every``
    and ``steps``), each printed as its own ``result`` record beside the calm phase's steps: intervals on one
    store share a launch, its imports and its writer's boot."""
    state = make_state(spec, rank)
    saver = Saver(spec, rank) if spec["saver"] != "none" else None
    step = Step(spec, state)
    if saver is not None:  # the first save's one-time costs (a writer's plan, DCP's checkpoint process) apart
        saver.save(0, state)
        saver.before_update()
        warm = time.time() + spec.get("settle_s", 60.0)
        while 0 not in saver.durable and time.time() < warm:
            time.sleep(0.05)
    dist.barrier()
    calm_began = time.time()
    calm = [step(None) for _ in range(spec["calm_steps"])]
    calm_span = [calm_began, time.time()]
    first = 1
    for every, count in spec.get("intervals") or [[spec["every"], spec["steps"]]]:
        steps, saves = saving_phase(saver, step, state, range(first, first + count), every)
        first += count
        say(rank=rank, result={"calm": [{"s": s, "reduce_s": r} for s, r in calm], "calm_span": calm_span,
                               "steps": steps, "saves": saves})
        dist.barrier()
    if spec.get("restore_after") and saver is not None:
        restore_timed(saver, state, rank)
    if spec.get("hang"):
        say(rank=rank, hanging=time.time())
        while True:  # training goes on until the node is lost (SIGKILL)
            step(None)
    if saver is not None:
        saver.close()


def saving_phase(saver: Saver | None, step: Step, state: dict[str, Any], indices: range,
                 every: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Steps ``indices``, saving every ``every``-th of them; then waits (a while) until its saves are durable.
    Returns the steps' and the saves' records."""
    steps: list[dict[str, Any]] = []
    saves: list[dict[str, Any]] = []
    for index in indices:
        began, began_pc = time.time(), time.perf_counter()
        if saver is not None and (index - indices.start + 1) % every == 0:
            saver.save(index, state)
            saves.append({"step": index, "requested": began, "returned": time.time()})
        flying = saver is not None and saver.in_flight(saves)
        _, reduce_s = step(saver)
        # The step's time counts its save() call: a save that blocks (its staging copy, a busy slot) costs the step.
        steps.append({"step": index, "t": began, "s": time.perf_counter() - began_pc, "reduce_s": reduce_s,
                      "in_flight": flying})
    settle = time.time() + (saver.spec.get("settle_s", 60.0) if saver is not None else 0.0)
    while saver is not None and saver.in_flight(saves) and time.time() < settle:
        time.sleep(0.05)
    for record in saves:
        record["durable"] = saver.durable.get(record["step"]) if saver is not None else None
    return steps, saves


def restore_timed(saver: Saver, state: dict[str, Any], rank: int) -> None:
    """Every rank restores the newest committed step at once, from a cold page cache (rank 0 empties the host's,
    every node's); prints ``{"restored": ...}`` with the seconds it took."""
    if rank == 0:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            pass
    dist.barrier()
    began = time.time()
    restored = saver.restore(state)
    say(rank=rank, restored={"seconds": time.time() - began, **restored})
    dist.barrier()


def resume(spec: dict[str, Any], rank: int, times: dict[str, float]) -> None:
    state = make_state(spec, rank, seed=rank + 1000)  # not the saved values: the restore must bring them
    saver = Saver(spec, rank)
    times["checkpointer"] = time.time()
    restored = saver.restore(state)
    times["restore"] = time.time()
    step = Step(spec, state)
    step(None)
    times["first_step"] = time.time()
    say(rank=rank, resume={"times": times, **restored})
    saver.close()
    dist.barrier()


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    times = {"launched": float(os.environ.get("CKPTIO_LAB_LAUNCHED", STARTED)), "started": STARTED,
             "imported": IMPORTED}
    dist.init_process_group("gloo")
    times["process_group"] = time.time()
    rank = dist.get_rank()
    if spec["phase"] == "train":
        train(spec, rank)
    else:
        resume(spec, rank, times)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
