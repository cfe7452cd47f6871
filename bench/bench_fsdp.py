"""A 2-rank FSDP2 training loop saved four ways, interleaved: ``dcp.save``, default ``dcp.async_save``, DCP-best
and ckptio, each judged against DCP-best measured in the same run.

The job: Hugging Face ``LlamaForCausalLM`` built from a config (4 layers, hidden 512, intermediate 1376, vocab
32k; about 45 M parameters, with AdamW about 520 MiB of state) when ``transformers`` is installed, else a plain
PyTorch transformer of the same sizes; ``fully_shard`` (FSDP2) on every block and the root, gloo on CPU, two
ranks (``ckptio.testing.ranks``), one torch thread each. The state saved is ``get_state_dict(model, optim)``
(sharded DTensors) to a directory under ``--dir``, fsync on, no throttle.

A round runs ``--clean`` steps with nothing in flight, then for each mode (the order rotates every round):
a save, then ``--every`` steps (the save interval), then waiting for that save to be durable, then ``--every``
clean steps (the save's paired baseline), so that no flush overlaps another mode's window. Round 0 is the
warm-up (ckptio's writer is booted before it; DCP-best's first save spawns its checkpoint process) and is not
counted. Per mode, over the steady rounds:

* blocking p50: time the training thread is blocked by a save — the save call, plus (DCP-best, ckptio) the wait
  for the staged copy (``staging_completion``, ``wait_staged()``) before the next ``optimizer.step`` — the slowest
  rank per save, median over saves;
* time lost per save: blocking + Σ over the interval's steps up to the one in which the save became durable,
  the staging wait taken out, − Σ over as many paired clean steps right after the save (the step time drifts by
  20–30 % over a run on a VM: against one mean clean step the first rounds' saves were charged up to 0.9 s more
  than the last rounds') + the wait for durability at the end of the interval (what the next save of the same
  mode would wait), the mean over ranks (at least the slowest rank's blocking), median over saves. The steps
  after the durable one are left out because they only add noise: each step moves ±0.1–0.3 s on its own (a
  ckptio save durable within its first step was charged +0.22 and +0.32 s in its third); the whole interval's
  figure is printed beside it;
* step inflation: median step time while the save's flush was still running ÷ median clean step;
* where the counted steps lost their time, against the paired ones: the training thread's CPU, run-queue wait
  and time asleep, the process's, its children's and the host's CPU, and per thread of the trainer's process its
  CPU, run-queue wait, system CPU and minor faults (default ``async_save``'s fresh staging shows there as page
  faults on the training thread; docs/planning.md).

    .venv/bin/python bench/bench_fsdp.py [--rounds 12] [--every 3] [--dir /tmp] [--plain]

Twelve steady rounds by default (~14 min on the 2-vCPU dev VM): a step here moves by 0.1–0.3 s on its own, and
over 4 rounds default ``async_save`` read 1.51 s lost per save in one run and 1.01 s in the next; over 12 the
modes' standard errors over saves read 0.04–0.09 s, under the 3-point bar (~0.16 s of a 3-step interval).

Goals (bench/README.md, issue 08): ckptio ÷ DCP-best ≤ 1.0 on blocking p50, ≤ 0.5 on time lost per save,
≤ 1.0 on step inflation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import (
    MiB,
    children_cpu,
    costs_line,
    host_cpu,
    prediction_check,
    quiet_dcp,
    ratio_line,
    scratch_dir,
    standard_error,
    thread_deltas,
    thread_schedstat,
    thread_stats,
    verdict,
)
from ckptio.demo.dcp_best import DcpBest
from ckptio.plan.costs.calibration import excess_from_trial
from ckptio.plan.measure.disk import DiskRates, measure_disk, on_local_disk
from ckptio.plan.measure.training import any_rank, measure_fresh_copy_drag, measure_save_loss

MODES = ("dcp-sync", "dcp-async", "dcp-best", "ckptio")


@dataclass(kw_only=True, slots=True)
class Spec:
    root: str
    rounds: int
    every: int
    clean: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    seq: int
    batch: int
    plain: bool


def build_model(spec: Spec) -> tuple[Any, list[Any], str]:
    """(model, blocks to shard, what it is): HF Llama from a config when transformers is installed."""
    import torch

    torch.manual_seed(0)
    if not spec.plain:
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError:
            pass
        else:
            config = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                                 num_hidden_layers=spec.layers, num_attention_heads=8, num_key_value_heads=8,
                                 max_position_embeddings=max(256, spec.seq))
            model = LlamaForCausalLM(config)
            return model, list(model.model.layers), "HF LlamaForCausalLM"
    model = _plain_lm_class()(spec)
    return model, list(model.blocks), "plain PyTorch transformer"


def _plain_lm_class() -> Any:
    import torch

    class _PlainLM(torch.nn.Module):
        """Embedding → pre-norm encoder blocks (causal mask) → LM head, Llama's sizes."""

        def __init__(self, spec: Spec) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(spec.vocab, spec.hidden)
            self.blocks = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(spec.hidden, 8, dim_feedforward=spec.intermediate, dropout=0.0,
                                                 batch_first=True, norm_first=True)
                for _ in range(spec.layers))
            self.head = torch.nn.Linear(spec.hidden, spec.vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            hidden = self.embed(ids)
            for block in self.blocks:
                hidden = block(hidden, src_mask=mask, is_causal=True)
            return self.head(hidden)

    return _PlainLM


class Loop:
    """One rank's model, optimizer and step."""

    def __init__(self, spec: Spec, rank: int) -> None:
        import torch
        from torch.distributed.fsdp import fully_shard

        self.spec = spec
        self.model, blocks, self.kind = build_model(spec)
        for block in blocks:
            fully_shard(block)
        fully_shard(self.model)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(rank)
        self.ids = torch.randint(0, spec.vocab, (spec.batch, spec.seq + 1), generator=gen)

    def step(self, before_update: Any = None) -> float:
        """One step; returns the seconds ``before_update`` waited (the staging wait)."""
        import torch.nn.functional as F

        inputs, targets = self.ids[:, :-1], self.ids[:, 1:]
        out = self.model(inputs)
        logits = out.logits if hasattr(out, "logits") else out
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        waited = before_update() if before_update is not None else 0.0
        self.optim.step()
        return waited

    def state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd}


class Savers:
    """The four savers of one rank; ``save`` starts one, ``done``/``drain`` track its durability."""

    def __init__(self, spec: Spec, rank: int) -> None:
        import torch.distributed as dist

        import ckptio

        self.root = spec.root
        self.async_group = dist.new_group(backend="gloo")
        self.best = DcpBest(process_group=dist.new_group(backend="gloo"))
        self.ck = ckptio.Checkpointer(os.path.join(spec.root, "ckptio"), max_pending=1, keep_last=2,
                                      events_path=os.path.join(spec.root, "events.rank{rank}.jsonl"))
        self.pending: Any = None
        self.mode = ""

    def save(self, mode: str, step: int, state: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        self.mode = mode
        path = os.path.join(self.root, mode, f"step-{step:06d}")
        if mode == "dcp-sync":
            dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
            self.pending = None
        elif mode == "dcp-async":
            self.pending = dcp.async_save(state, checkpoint_id=path, process_group=self.async_group)
        elif mode == "dcp-best":
            self.pending = self.best.save(state, dcp.FileSystemWriter(path)).upload_completion
        else:
            self.pending = self.ck.save(step, state)

    def before_update(self) -> float:
        """The async savers' rule: the staged copy is complete before the optimizer mutates the state."""
        if self.mode == "dcp-best":
            return self.best.wait_staged()
        if self.mode == "ckptio":
            t0 = time.perf_counter()
            self.ck.wait_staged()
            return time.perf_counter() - t0
        return 0.0

    def done(self) -> bool:
        return self.pending is None or bool(self.pending.done())

    def drain(self) -> None:
        if self.pending is None:
            return
        if self.mode == "dcp-best":
            self.best.wait()
        elif self.mode == "ckptio":
            self.pending.wait()
        else:
            self.pending.result()
        self.pending = None

    def close(self) -> None:
        self.drain()
        self.best.close()
        self.ck.close()


def _rank(rank: int, world: int, spec: Spec) -> None:
    import torch.distributed as dist

    quiet_dcp()
    loop = Loop(spec, rank)
    savers = Savers(spec, rank)
    savers.ck.writer_ready(300)
    for _ in range(2):
        loop.step()  # AdamW's state exists from here on: every save has its full size
    # The planner's input for default async_save (Host.fresh_copy_drag), measured before any save runs.
    # Four bracketed runs, not two: over two 3-step runs the drag read 1.31 and 1.43 an hour apart (2026-12-05),
    # and default async_save's prediction moved with it (1.08, 1.29); with four, 1.23 (and 1.31: what that mode
    # loses moves too, 0.93-1.20 s per save over these runs).
    drag = measure_fresh_copy_drag(loop.step, loop.state, steps=spec.clean, repeats=4)
    # ckptio's (Host.direct_io_s_per_gib, from the trial's cost): a trial save of ckptio's own writer, every
    # rank at once, into a root of its own on the disk the checkpoints go to. Its brackets are the loop's own
    # baseline (spec.clean steps, as the paired steps right after a save).
    trial_lost = _trial_save_loss(loop, spec)
    clean: list[float] = []
    clean_sched: list[list[float]] = []
    saves: list[dict[str, Any]] = []
    step = 0
    try:
        for rnd in range(spec.rounds + 1):
            times, scheds, _ = _clean_steps(loop, spec.clean)
            clean += times
            clean_sched += scheds
            step += spec.clean
            for i in range(len(MODES)):
                mode = MODES[(i + rnd) % len(MODES)]
                dist.barrier()
                step += 1
                saves.append(_one_save(loop, savers, mode, step, spec=spec, rnd=rnd))
                step += 2 * spec.every
    finally:
        savers.close()
    with open(os.path.join(spec.root, f"result.rank{rank}.json"), "w") as f:
        json.dump({"clean": clean, "clean_sched": clean_sched, "saves": saves, "kind": loop.kind,
                   "fresh_copy_drag": drag, "trial_lost_s": trial_lost}, f)


def _trial_save_loss(loop: Loop, spec: Spec) -> float:
    """:func:`ckptio.plan.measure.training.measure_save_loss` with a Checkpointer of its own (its step numbers must not
    meet the run's); its checkpoints are removed."""
    import torch.distributed as dist

    import ckptio

    root = os.path.join(spec.root, "trial")
    with ckptio.Checkpointer(root, max_pending=1, keep_last=1) as trial:
        trial.save(0, loop.state()).wait()  # warm-up: writer booted, staging memory allocated

        def save(index: int) -> Callable[[], bool]:
            return trial.save(index, loop.state()).done

        lost = measure_save_loss(lambda: loop.step(trial.wait_staged), save, steps=spec.clean, any_writing=any_rank)
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
    return lost


SCHED = ("cpu", "runqueue", "process_cpu", "children_cpu", "host_busy", "host_idle")
"""What :func:`_sched` returns, in order: the report's names for the parts of a save's loss."""


def _sched() -> tuple[float, ...]:
    """The training thread's CPU time and run-queue wait, its process's CPU time (every thread: training, gloo,
    DCP's staging and writer threads), its child processes' (DCP-best's checkpoint process, ckptio's writer), and
    the whole host's busy and idle CPU time: what the report splits a save's loss by."""
    return (*thread_schedstat(), time.process_time(), children_cpu(), *host_cpu())


def _timed_step(loop: Loop, before_update: Any = None) -> tuple[float, float, list[float], dict[str, list[float]]]:
    """One step: its seconds (the staging wait taken out), that wait, and its :func:`_sched` and per-thread
    (:func:`thread_stats`) deltas."""
    before, threads = _sched(), thread_stats()  # read before the clock starts: they are not the step's time
    t0 = time.perf_counter()
    waited = loop.step(before_update)
    seconds = time.perf_counter() - t0 - waited
    sched = [b - a for a, b in zip(before, _sched(), strict=True)]
    return seconds, waited, sched, thread_deltas(threads, thread_stats())


def _clean_steps(loop: Loop, n: int) -> tuple[list[float], list[list[float]], list[dict[str, list[float]]]]:
    """``n`` steps with nothing in flight: each one's seconds, :func:`_sched` deltas and per-thread deltas."""
    times, scheds, threads = [], [], []
    for _ in range(n):
        seconds, _, sched, per_thread = _timed_step(loop)
        times.append(seconds)
        scheds.append(sched)
        threads.append(per_thread)
    return times, scheds, threads


def _one_save(loop: Loop, savers: Savers, mode: str, step: int, *, spec: Spec, rnd: int) -> dict[str, Any]:
    """A save, its interval of steps, and the wait for durability at the end of it."""
    t0 = time.perf_counter()
    savers.save(mode, step, loop.state())
    blocking = time.perf_counter() - t0
    steps, inflight, waits, sched, threads = [], [], 0.0, [], []
    for _ in range(spec.every):
        seconds, waited, step_sched, per_thread = _timed_step(loop, savers.before_update)
        sched.append(step_sched)
        threads.append(per_thread)
        waits += waited
        steps.append(seconds)
        if not savers.done():
            inflight.append(seconds)
    t0 = time.perf_counter()
    savers.drain()
    drain = time.perf_counter() - t0
    paired, paired_sched, paired_threads = _clean_steps(loop, spec.every)
    # The steps a save can slow: those it was in flight at the end of, and the one in which it became durable.
    window = min(len(inflight) + 1, len(steps))
    return {"mode": mode, "round": rnd, "blocking": blocking + waits, "steps": steps, "inflight": inflight,
            "window": window, "sched": sched, "threads": threads, "drain": drain, "paired": paired,
            "paired_sched": paired_sched, "paired_threads": paired_threads}


def summarize(results: list[dict[str, Any]], every: int) -> dict[str, dict[str, float]]:
    """Per mode: blocking p50 (slowest rank per save), time lost per save (p50 of the mean over ranks, and the
    standard error of the saves' mean: how far apart the saves are), step inflation."""
    clean_steps = [s for r in results for s in r["clean"]]
    clean = statistics.fmean(clean_steps)
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        per_rank = _steady_saves(results, mode)
        blocking, lost, whole, inflight = [], [], [], []
        for saves in zip(*per_rank, strict=True):
            blocking.append(max(s["blocking"] for s in saves))
            lost.append(_job_lost(saves, whole_interval=False))
            whole.append(_job_lost(saves, whole_interval=True))
            inflight.extend(t for s in saves for t in s["inflight"])
        out[mode] = {
            **_split(per_rank),
            "blocking_p50": statistics.median(blocking),
            "lost_per_save": statistics.median(lost),
            "lost_stderr": standard_error(lost),
            "lost_whole_interval": statistics.median(whole),
            "inflation": statistics.median(inflight) / statistics.median(clean_steps) if inflight else 1.0,
            "inflight_steps": float(len(inflight)),
        }
    # Cores training keeps busy per rank (Host.train_cores): its process's CPU time (training, gloo and
    # autograd threads) over the clean steps' wall time. FSDP's ranks sleep in their collectives: less than one.
    process_cpu = sum(s[SCHED.index("process_cpu")] for r in results for s in r.get("clean_sched") or [])
    train_cores = process_cpu / sum(clean_steps) if process_cpu > 0 else 1.0
    out["clean"] = {"step_s": clean, "every": float(every), "train_cores": train_cores}
    return out


def _job_lost(saves: tuple[dict[str, Any], ...], *, whole_interval: bool) -> float:
    """One save's time lost to the job: the mean over ranks of each rank's, at least the slowest rank's blocking
    (the others wait for it at the next collective). Not the slowest rank's: over a save's steps lockstep ranks'
    offset moves and moves back, so one rank's sum is high by what another's is low (ckptio.demo.steady)."""
    mean = statistics.fmean(_lost(s, len(s["steps"]) if whole_interval else s["window"]) for s in saves)
    return max(mean, *(s["blocking"] for s in saves))


def _lost(save: dict[str, Any], steps: int) -> float:
    """One rank's time lost to one save, counting its interval's first ``steps`` steps against as many paired
    ones (the excess not floored: a rank's sum is as likely low as high)."""
    excess = sum(save["steps"][:steps]) - sum(save["paired"][:steps])
    return save["blocking"] + excess + save["drain"]


def _counted_steps(save: dict[str, Any]) -> Iterator[tuple[int, float, list[float], dict[str, list[float]]]]:
    """The steps a save is charged with, as (sign, seconds, :data:`SCHED` deltas, per-thread deltas): +1 for its
    interval's steps up to the durable one, -1 for as many paired clean steps."""
    k = save["window"]
    for sign, prefix, times in ((1, "", save["steps"]), (-1, "paired_", save["paired"])):
        yield from ((sign, *step) for step in zip(times[:k], save[f"{prefix}sched"][:k], save[f"{prefix}threads"][:k],
                                                   strict=True))


def _split(per_rank: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Where a save's interval steps (up to the durable one) lost their time against its paired clean steps, per
    save, mean over ranks and saves: more CPU time on the training thread, more run-queue wait (background work
    took its core), more time asleep (waiting for the other rank at a collective, or for the GIL held by a thread
    of its own process), and more CPU of the process, its children and the host (busy and idle: the host figures
    count both ranks)."""
    parts = dict.fromkeys((*SCHED, "asleep"), 0.0)
    saves = [save for rank in per_rank for save in rank]
    for save in saves:
        for sign, seconds, deltas, _ in _counted_steps(save):
            for name, value in zip(SCHED, deltas, strict=True):
                parts[name] += sign * value
            parts["asleep"] += sign * (seconds - deltas[0] - deltas[1])
    return {f"{k}_per_save": v / max(len(saves), 1) for k, v in parts.items()}


def _steady_saves(results: list[dict[str, Any]], mode: str) -> list[list[dict[str, Any]]]:
    """Per rank, the mode's saves after the warm-up round."""
    return [[s for s in r["saves"] if s["mode"] == mode and s["round"] > 0] for r in results]


def _thread_split(per_rank: list[list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Per thread name of the trainer's process: [CPU, run-queue wait, system CPU, minor faults] of the interval's
    steps up to the durable one, more than as many paired clean steps, per save (mean over ranks and saves)."""
    parts: dict[str, list[float]] = {}
    saves = [save for rank in per_rank for save in rank]
    for save in saves:
        for sign, _, _, threads in _counted_steps(save):
            for name, values in threads.items():
                row = parts.setdefault(name, [0.0] * len(values))
                for i, value in enumerate(values):
                    row[i] += sign * value
    return {name: [v / max(len(saves), 1) for v in row] for name, row in parts.items()}


def _threads_line(results: list[dict[str, Any]]) -> str:
    """The report's line of :func:`_thread_split`: per mode, the four threads whose CPU and wait moved most."""
    parts = []
    for mode in MODES:
        split = _thread_split(_steady_saves(results, mode))
        top = sorted(split.items(), key=lambda kv: -abs(kv[1][0]) - abs(kv[1][1]))[:4]
        parts.append(f"{mode} " + ", ".join(f"{name} {cpu:+.2f}/{wait:+.2f}/{system:+.2f}/{faults:+.0f}"
                                            for name, (cpu, wait, system, faults) in top))
    return ("the trainer's threads in those steps, more than in the paired ones, per save (mean of ranks; CPU / "
            "run-queue / system CPU s / minor faults; the four that moved most): " + "; ".join(parts))


def predict(state_bytes: int, every: int, clean_step_s: float, costs: Any, disk: DiskRates, *,
            train_cores: float, drag: float, direct_io_s_per_gib: float = 0.0) -> dict[str, Any]:
    """Issue 12: the planner's time lost per save for each mode of this loop (2 ranks sharing the disk)."""
    from ckptio.plan.costs.background import predict_modes
    from ckptio.plan.costs.inputs import Host, Workload

    cores_per_rank = (os.cpu_count() or 1) / 2
    host = Host(cores_per_rank=cores_per_rank, train_cores=min(train_cores, cores_per_rank), fresh_copy_drag=drag,
                direct_io_s_per_gib=direct_io_s_per_gib)
    workload = Workload(bytes_per_rank=state_bytes / 2, interval_s=every * clean_step_s,
                        # The loop's async_save gets checkpoint_id=, not a FileSystemWriter: DCP stages through its
                        # DefaultStager, one copy per tensor, DTensors included.
                        dtensor_share=0.0, lockstep_ranks=2)
    # The store is this host's disk: DCP's buffered files move at their fsync.
    return predict_modes(workload, on_local_disk(disk, job_bytes=state_bytes, ranks=2), host=host, costs=costs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="steady rounds (after one warm-up round)")
    parser.add_argument("--every", type=int, default=3, help="steps between saves")
    parser.add_argument("--clean", type=int, default=3, help="steps with nothing in flight at each round's start")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1376)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--plain", action="store_true", help="a plain PyTorch transformer even with transformers")
    parser.add_argument("--results", default=None, help="also write every rank's per-step records here (JSON)")
    parser.add_argument("--dir", default=None, help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    args = parser.parse_args()

    quiet_dcp()
    from ckptio.testing.ranks import run_ranks

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # DCP-best's checkpoint process rendezvouses here
    with scratch_dir(args.dir, "ckptio-bench-fsdp-") as root:
        spec = Spec(root=str(root), rounds=args.rounds, every=args.every, clean=args.clean, layers=args.layers,
                    hidden=args.hidden, intermediate=args.intermediate, vocab=args.vocab, seq=args.seq,
                    batch=args.batch, plain=args.plain)
        # The planner's inputs come first, measured before any mode runs.
        from ckptio.plan.measure.writer_costs import measure_writer_costs

        costs = measure_writer_costs(directory=str(root))
        disk = measure_disk(str(root))
        began = time.perf_counter()
        run_ranks(2, _rank, spec)
        results = []
        for rank in range(2):
            with open(root / f"result.rank{rank}.json") as f:
                results.append(json.load(f))
        state_bytes = sum(p.stat().st_size for p in (root / "dcp-sync").rglob("*") if p.is_file())
        state_bytes //= max(1, args.rounds + 1)
    if args.results:
        Path(args.results).write_text(json.dumps(results))
    figures = summarize(results, args.every)
    print(f"{results[0]['kind']}: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; FSDP2 on 2 gloo "
          f"ranks; checkpoint ≈ {state_bytes / MiB:.0f} MiB; clean step {figures['clean']['step_s'] * 1e3:.0f} ms; "
          f"a save every {args.every} steps, {args.rounds} steady rounds; {time.perf_counter() - began:.0f} s")
    print(json.dumps({"spec": asdict(spec) | {"root": "<scratch>"}}))
    costs_line(costs)
    for mode in MODES:
        f = figures[mode]
        print(f"{mode:<10} blocking p50 {f['blocking_p50'] * 1e3:7.1f} ms   "
              f"time lost / save {f['lost_per_save']:6.2f} s (saves' standard error {f['lost_stderr']:.2f} s; "
              f"whole interval {f['lost_whole_interval']:.2f} s)   "
              f"step inflation {f['inflation']:.3f} (n={f['inflight_steps']:.0f})")
    print("the interval's steps up to the durable one, more than as many paired clean steps, per save (mean of "
          "ranks; host: both ranks): "
          + "; ".join(f"{mode} cpu {figures[mode]['cpu_per_save']:+.2f} s, run-queue "
                      f"{figures[mode]['runqueue_per_save']:+.2f} s, asleep {figures[mode]['asleep_per_save']:+.2f} s "
                      f"(process cpu {figures[mode]['process_cpu_per_save']:+.2f} s, children "
                      f"{figures[mode]['children_cpu_per_save']:+.2f} s, host busy "
                      f"{figures[mode]['host_busy_per_save']:+.2f} s, host idle "
                      f"{figures[mode]['host_idle_per_save']:+.2f} s)" for mode in MODES))
    print(_threads_line(results))
    ck, best = figures["ckptio"], figures["dcp-best"]
    block, lost, infl = (ck["blocking_p50"] / best["blocking_p50"], ck["lost_per_save"] / best["lost_per_save"],
                         ck["inflation"] / best["inflation"])
    print(f"ckptio / DCP-best: blocking {block:.2f} ({verdict(block, 1.0, at_most=True)}), time lost {lost:.2f} "
          f"({verdict(lost, 0.5, at_most=True)}), inflation {infl:.2f} ({verdict(infl, 1.0, at_most=True)})")
    clean = figures["clean"]["step_s"]
    train_cores = figures["clean"]["train_cores"]
    drag = statistics.fmean(r["fresh_copy_drag"] for r in results)
    trial = statistics.fmean(r["trial_lost_s"] for r in results)
    modelled = predict(state_bytes, args.every, clean, costs, disk, train_cores=train_cores, drag=drag)["ckptio"]
    direct_io = excess_from_trial(trial, modelled, state_bytes / 2)
    predicted = predict(state_bytes, args.every, clean, costs, disk, train_cores=train_cores, drag=drag,
                        direct_io_s_per_gib=direct_io)
    print(f"planner (issue 12): disk {disk.direct_bytes_per_s / MiB:.0f} MiB/s (O_DIRECT), "
          f"{disk.writeback_bytes_per_s / MiB:.0f} MiB/s (page-cache "
          f"write-back at fsync), {os.cpu_count()} cores for 2 ranks, training keeps "
          f"{train_cores:.2f} core busy per rank, its step {1 + drag:.3f}x with a fresh copy of its state alive, "
          f"a trial ckptio save cost it {trial:.2f} s, the model's CPU costs {modelled.lost_per_save_s:.2f}: "
          f"{direct_io:.2f} s/GiB more (direct_io_s_per_gib); time lost per save, predicted against "
          "measured:")
    prediction_check({mode.replace("-", "_"): (predicted[mode.replace("-", "_")].lost_per_save_s,
                                               figures[mode]["lost_per_save"], args.every * clean) for mode in MODES})
    ratio_line(blocking_vs_dcp_best=block, lost_vs_dcp_best=lost, inflation_vs_dcp_best=infl,
               lost_vs_dcp_async=ck["lost_per_save"] / figures["dcp-async"]["lost_per_save"],
               lost_vs_dcp_save=ck["lost_per_save"] / figures["dcp-sync"]["lost_per_save"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
