"""``ckptio demo``: the main job — a multi-rank training run saved four ways, then resumed bit-exact.

Only parses arguments; everything else lives in :mod:`ckptio.demo`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptio.demo.demo_config import DemoConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train on N ranks, save with dcp.save, dcp.async_save, DCP-best and ckptio, compare, resume bit-exact",
        description=(
            "Launch a small multi-rank training job (gloo on CPU, 127.0.0.1) four times on the same "
            "emulated shared store, with the same save steps: synchronous torch.distributed.checkpoint.save, "
            "default dcp.async_save, DCP's best async path (checkpoint process, async staging into shared "
            "memory), ckptio. The planner picks the save interval from a quick measurement of this machine "
            "(the shortest at which the flush keeps up with headroom). Print the prediction, the measured "
            "stall, slower steps, time lost and flush lag per save (the first save apart, the others as "
            "medians), resume the newest ckptio checkpoint in a fresh process group, check the loss "
            "continues bit-exact, write a report, and end with one verdict line."
        ),
    )
    parser.add_argument("--ranks", type=int, default=None, help="ranks of the job (default 2)")
    parser.add_argument(
        "--every",
        type=int,
        default=None,
        help="save every N steps (default: the planner's interval; a shorter one shows the flush falling behind)",
    )
    parser.add_argument(
        "--saves", type=int, default=None, help="saves per run: the first, then steady ones (default 5)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per run (default (saves + 1) x every)"
    )
    parser.add_argument(
        "--store-bandwidth",
        default=None,
        help="write bandwidth of the emulated shared store, e.g. 200MiB/s (default 200MiB/s; quick 96MiB/s)",
    )
    parser.add_argument(
        "--store", choices=("posix", "s3"), default="posix", help="posix directory, or an embedded S3 server"
    )
    parser.add_argument("--out", default="ckptio-demo", help="working directory (default ./ckptio-demo)")
    parser.add_argument("--quick", action="store_true", help="a small model and few steps (about a minute)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and data")
    parser.add_argument("--cluster", action="store_true",
                        help="the main job at cluster shape in the cluster lab (root, Linux namespaces, FUSE; "
                        "`make labdeps`): 4 nodes behind shaped links, a parallel FS and S3, ckptio against DCP-best, "
                        "a node lost and resumed; --ranks is then ranks per node (1 or 2)")
    parser.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> DemoConfig:
    """The :class:`~ckptio.demo.demo_config.DemoConfig` the arguments describe (``--quick`` changes defaults)."""
    from ckptio.demo.demo_config import QUICK, DemoConfig
    from ckptio.plan.units import parse_rate

    base = QUICK if args.quick else DemoConfig()
    changes: dict[str, Any] = {"store": args.store, "out": args.out, "seed": args.seed}
    for name in ("ranks", "steps", "every", "saves"):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    if args.store_bandwidth is not None:
        changes["store_bandwidth"] = parse_rate(args.store_bandwidth, what="--store-bandwidth")
    return replace(base, **changes)


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        return run_cluster(args)
    from ckptio.demo.demo_runner import run_demo

    outcome = run_demo(build_config(args))
    return 0 if outcome.resume.bit_exact else 1


def run_cluster(args: argparse.Namespace) -> int:
    """``--cluster``: the lab's run (:mod:`ckptio.demo.cluster`); exit 1 where the lab cannot run, saying why."""
    from pathlib import Path

    from ckptio.demo.cluster.runner import ClusterConfig, run_cluster_demo
    from ckptio.testing.cluster import LabUnavailable

    config = ClusterConfig(ranks_per_node=args.ranks or 1, out=Path(args.out) / "cluster",
                           **({"every": args.every} if args.every else {}),
                           **({"saves": args.saves} if args.saves else {}))
    try:
        run_cluster_demo(config)
    except LabUnavailable as exc:
        print(f"ckptio demo --cluster: the cluster lab cannot run here: {exc}", file=sys.stderr)
        return 1
    return 0
