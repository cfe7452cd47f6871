"""Two levels against one: the planner's figure for Llama 3 405B on 512 ranks, and the model against injected failures.

1. Figure (issue 10): ``mlperf-llama3-405b`` on 512 ranks (64 nodes of 8), MTBF 3 h, durable store 150 GiB/s
   (read and write), local tier 5 GB/s per node, one partner copy. Lost GPU-hours per day for one level
   (every save durable) and two levels (local + partner every τ, durable every k-th), both at their optimum,
   once with the store unconstrained and once with the job's flushes held to ``--share`` of the store's time.
   Anchor: the single-level figure of the same run. Goal: two levels below one.
2. Model against failures: each schedule run through ``--failures`` injected failures (node loss, whole-job
   loss, soft), simulated lost share ÷ planned. Goal: within 0.9–1.1.

    .venv/bin/python bench/bench_plan_levels.py [--share 0.05] [--failures 5000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import ratio_line
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.intervals import Schedule
from ckptio.plan.costs.levels import LocalLevel
from ckptio.plan.costs.multilevel import TwoLevelPlan, plan_two_levels
from ckptio.plan.costs.store import StoreLimits
from ckptio.plan.job.checkpoint import Parallelism, shape_checkpoint
from ckptio.plan.job.presets import PRESETS
from ckptio.plan.simulation.failure_injection import simulate_failures
from ckptio.plan.units import format_duration

GIB = float(1 << 30)


def figure_plan(share: float) -> TwoLevelPlan:
    model = PRESETS["mlperf-llama3-405b"].spec(parallelism=Parallelism.for_ranks(ranks=512, tp=8, pp=32, zero=1))
    shape = shape_checkpoint(model)
    storage = StoreLimits(write_bytes_per_s=150 * GIB, read_bytes_per_s=150 * GIB)
    schedule = Schedule(mtbf_s=3 * 3600.0)
    budget = plan_burst(shape, storage, schedule)
    return plan_two_levels(shape, storage, schedule, budget, local=LocalLevel(bytes_per_s=5e9, replicas=1),
                           durable_share=share)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=float, default=0.05, help="durable store share of the second plan")
    parser.add_argument("--failures", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    gains: dict[str, float] = {}
    sim_ratios: list[float] = []
    sim_seconds = 0.0
    print(f"{'store share':12}{'schedule':10}{'save every':>12}{'durable every':>15}{'GPU-h/day':>11}"
          f"{'simulated':>11}{'sim/plan':>10}")
    for share in (1.0, args.share):
        plan = figure_plan(share)
        assert plan.two_level is not None
        for name, loss in (("one", plan.single), ("two", plan.two_level)):
            start = time.perf_counter()
            sim = simulate_failures(plan.times, plan.rates, 1, loss.schedule, failures=args.failures, seed=args.seed)
            sim_seconds += time.perf_counter() - start
            ratio = sim.lost_fraction / loss.lost_fraction
            sim_ratios.append(ratio)
            print(f"{share:<12g}{name:10}{format_duration(loss.schedule.local_interval_s):>12}"
                  f"{format_duration(loss.schedule.durable_interval_s):>15}{loss.gpu_hours_per_day(512):>11.1f}"
                  f"{sim.gpu_hours_per_day(512):>11.1f}{ratio:>10.3f}")
        gains[f"two_over_one_share_{share:g}"] = (plan.two_level.gpu_hours_per_day(512)
                                                   / plan.single.gpu_hours_per_day(512))
    print(f"\n{len(sim_ratios)} runs × {args.failures} failures simulated in {sim_seconds:.2f} s")
    ok = all(g < 1 for g in gains.values()) and all(0.9 <= r <= 1.1 for r in sim_ratios)
    print(f"two levels below one, simulated within 0.9-1.1 of planned: {'met' if ok else 'MISSED'}")
    ratio_line(**{k.replace(".", "p"): v for k, v in gains.items()},
               sim_over_plan_min=min(sim_ratios), sim_over_plan_max=max(sim_ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
