"""Planning at 1,024–16,384 ranks: what the coordinator path costs, in one process, with synthetic local plans.

Each synthetic rank holds what an FSDP rank of a transformer holds: a row shard of ``--sharded`` large tensors
(their chunks tile the global tensor across ranks), ``--replicated`` small tensors every rank has (norms, a step
counter: de-duplicated to one writer), and one pickled object. The script builds N such local plans (as DCP's
``create_local_plan`` would, planner data included) and times the coordinator's whole work on them, from the bytes
the ranks sent to the bytes it sends back: DCP's (unpickle every ``SavePlan``, ``create_global_plan``, pickle every
final plan) — the anchor, in the same run — and ckptio's (unpickle every rank's plain-value plan, ``plan_globally``,
pickle every rank's answer; ``engine.trainer.global_plan``). Both results are checked equal, final plans and
metadata.

Printed per N: the coordinator's wall and CPU seconds, ckptio's and DCP's; the bytes one rank receives (its answer,
as ``scatter_object_list`` sends it: padded to the largest); the bytes the coordinator receives (every local plan);
the bytes moved across the job; and, for comparison, what an all-gather would move (every rank receives every
plan). Linear growth means ``coord_time_growth`` and ``job_bytes_growth`` ≈ 1 (time and bytes at the largest N over the
smallest, divided by the rank ratio), ``per_rank_bytes_growth`` ≈ 1 (a rank's share does not grow), while the
all-gather's job bytes grow with N² (``allgather_job_bytes_growth`` ≈ the rank ratio).

    .venv/bin/python bench/bench_plan_scale.py [--ranks 1024,2048,4096,8192,16384] [--sharded 8] [--replicated 4]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

from _common import MiB, quiet_dcp, ratio_line
from ckptio.engine.trainer.global_plan import (
    collector_paused,
    encode_local_plan,
    finish_local_plan,
    plan_globally,
)
from ckptio.engine.trainer.rank_plan import make_planner


def _item(fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...], global_size: tuple[int, ...],
          kind: WriteItemType) -> WriteItem:
    return WriteItem(
        index=MetadataIndex(fqn, torch.Size(offsets)),
        type=kind,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)),
            properties=TensorProperties(dtype=torch.bfloat16),
            size=torch.Size(global_size),
        ),
    )


def local_plans(n: int, sharded: int, replicated: int) -> list[SavePlan]:
    rows, cols = 8, 4096  # each rank's shard: 8 rows of every sharded tensor
    plans = []
    for rank in range(n):
        items = [_item(f"model.layers.{i}.weight", (rank * rows, 0), (rows, cols), (n * rows, cols),
                       WriteItemType.SHARD) for i in range(sharded)]
        items += [_item(f"model.norms.{i}.weight", (0,), (cols,), (cols,), WriteItemType.TENSOR)
                  for i in range(replicated)]
        items.append(WriteItem(index=MetadataIndex("extra.config"), type=WriteItemType.BYTE_IO))
        mappings = {item.index.fqn: tuple(item.index.fqn.split(".")) for item in items}
        plans.append(SavePlan(items=items, planner_data=mappings))
    return plans


def _timed(work: Callable[[], tuple[Any, Any]]) -> tuple[float, float, Any, Any]:
    """Wall and CPU seconds of one coordinator's work: on a shared machine the CPU time is the figure that does not
    depend on what else runs; the wall time is what the ranks wait for."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    out = work()
    return time.perf_counter() - t0, time.process_time() - c0, *out


def dcp_coordinator(blobs: list[bytes]) -> tuple[list[bytes], Metadata]:
    """DCP's coordinator: unpickle every rank's SavePlan (as gather_object does), plan, pickle each final plan."""
    plans = [pickle.loads(b) for b in blobs]
    final_plans, metadata = make_planner({}, is_coordinator=True).create_global_plan(plans)
    return [pickle.dumps(p) for p in final_plans], metadata


def ckptio_coordinator(blobs: list[bytes]) -> tuple[list[bytes], Metadata]:
    """ckptio's: unpickle every rank's plain-value plan, plan, pickle each rank's answer."""
    with collector_paused():  # as coordinated_plan gathers
        plans = [pickle.loads(b) for b in blobs]
    answers, metadata = plan_globally(plans)
    return [pickle.dumps(a) for a in answers], metadata


def measure(n: int, sharded: int, replicated: int) -> dict[str, float]:
    plans = local_plans(n, sharded, replicated)
    dcp_in = [pickle.dumps(p) for p in plans]
    ours_in = [pickle.dumps(encode_local_plan(p)) for p in plans]
    # The anchor, DCP's own coordinator, on the same plans in the same run; then ckptio's.
    dcp_seconds, dcp_cpu, dcp_out, dcp_metadata = _timed(lambda: dcp_coordinator(dcp_in))
    seconds, cpu, ours_out, metadata = _timed(lambda: ckptio_coordinator(ours_in))
    finals = [finish_local_plan(p, pickle.loads(a)) for p, a in zip(plans, ours_out, strict=True)]
    assert finals == [pickle.loads(b) for b in dcp_out] and metadata == dcp_metadata
    assert sum(len(p.items) for p in finals) == n * sharded + replicated + 1
    assert len(metadata.state_dict_metadata) == sharded + replicated + 1
    per_rank = max(map(len, ours_out))  # scatter_object_list pads every rank's message to the largest
    gathered = sum(map(len, ours_in))
    return {"n": n, "seconds": seconds, "cpu": cpu, "dcp_seconds": dcp_seconds, "dcp_cpu": dcp_cpu,
            "per_rank": per_rank, "coordinator_in": gathered, "job": gathered + per_rank * n,
            "allgather_per_rank": gathered, "allgather_job": gathered * n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1024,2048,4096,8192,16384")
    ap.add_argument("--sharded", type=int, default=8)
    ap.add_argument("--replicated", type=int, default=4)
    args = ap.parse_args()
    quiet_dcp()
    measure(64, args.sharded, args.replicated)  # warm-up: first-call costs are not the coordinator's
    rows = [measure(int(n), args.sharded, args.replicated) for n in args.ranks.split(",")]
    print(f"{'ranks':>6} {'coord s':>8} {'cpu s':>6} {'DCP s':>7} {'cpu s':>6} {'rank recv KiB':>13} "
          f"{'coord recv MiB':>14} {'job MiB':>9} "
          f"{'all-gather: rank recv MiB':>25} {'all-gather: job GiB':>19}")
    for r in rows:
        print(f"{r['n']:6d} {r['seconds']:8.3f} {r['cpu']:6.3f} {r['dcp_seconds']:7.3f} {r['dcp_cpu']:6.3f} "
              f"{r['per_rank'] / 1024:13.1f} {r['coordinator_in'] / MiB:14.1f} "
              f"{r['job'] / MiB:9.1f} {r['allgather_per_rank'] / MiB:25.1f} {r['allgather_job'] / (1 << 30):19.1f}")
    first, last = rows[0], rows[-1]
    scale = last["n"] / first["n"]
    ratio_line(
        ranks=f"{first['n']}-{last['n']}",
        plan_max_ranks_s=last["seconds"],
        plan_max_ranks_cpu_s=last["cpu"],
        plan_vs_dcp_at_max=last["seconds"] / last["dcp_seconds"],
        plan_cpu_vs_dcp_at_max=last["cpu"] / last["dcp_cpu"],
        coord_time_growth=last["seconds"] / first["seconds"] / scale,
        job_bytes_growth=last["job"] / first["job"] / scale,
        per_rank_bytes_growth=last["per_rank"] / first["per_rank"],
        allgather_job_bytes_growth=last["allgather_job"] / first["allgather_job"] / scale,
        allgather_vs_coordinator_job_bytes_at_max=last["allgather_job"] / last["job"],
    )


if __name__ == "__main__":
    main()
