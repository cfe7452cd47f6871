"""``ckptio admit``: exit 0 when the job may start, 1 with a line per reason when it may not, 2 on bad usage.

Owns the command's flags and output, written for a Slurm prolog or a Kubernetes init container: the first
line says ADMIT or REFUSE, each following line one reason (``refuse:``) or warning (``warn:``). The rules
themselves are :mod:`ckptio.plan.admit`'s.

With ``--probe`` the root's residency and capabilities are checked before the probe writes anything: a root
that breaks residency is refused without being probed (no plan is made then).
"""

from __future__ import annotations

import argparse
import json

from ckptio._cli.job_args import (
    MAX_KEEP_LAST,
    MAX_RANKS,
    add_job_arguments,
    add_storage_arguments,
    checkpoint_model,
    duration_flag,
    int_flag,
    job_from_args,
    schedule,
)
from ckptio._cli.pace_args import add_pace_arguments, flush_pace, store_share
from ckptio._cli.probe_cmd import MAX_PROBE_SECONDS, MIN_PROBE_SECONDS
from ckptio._proc import sigterm_as_interrupt
from ckptio.errors import ConfigError, ResidencyError, StoreCapabilityError
from ckptio.plan.admit import Admission, AdmissionPolicy, admit
from ckptio.plan.costs.budget import plan_burst
from ckptio.plan.costs.pace import plan_pace
from ckptio.plan.measure.probe import ProbeConfig, probe, target_capabilities
from ckptio.plan.units import format_duration
from ckptio.policy.residency import Residency


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "admit",
        usage="ckptio admit [options]  (ckptio admit --help lists them)",
        help="admission gate: may this job start on this store? (exit 0 admit, 1 refuse, 2 usage)",
        description="Refuse a job whose store cannot finish a save within the interval, whose stall is over "
        "budget, whose root lacks space for keep_last + 1 checkpoints, whose burst exceeds the PUT rate, "
        "that checkpoints onto the dataset volume above --split-volumes-above ranks, under $HOME, into a "
        "public bucket or a region outside --allowed-region, or that asks more of the store than --store-share "
        "(its burst, or with --flush-pace its paced demand).",
    )
    add_job_arguments(parser)
    add_storage_arguments(parser)
    parser.add_argument("--probe", action="store_true", help="probe --root now instead of reading --profile")
    parser.add_argument("--probe-seconds", default="20", help="time bound of --probe (20)")
    parser.add_argument("--root", help="checkpoint root (a directory or s3:// URL)")
    parser.add_argument("--data-dir", action="append", default=[], help="a directory the data loader reads")
    parser.add_argument("--keep-last", type=int, default=3, help="committed checkpoints kept (3)")
    parser.add_argument("--max-stall", help="most stall per checkpoint (default: a tenth of the interval)")
    parser.add_argument(
        "--split-volumes-above", type=int, default=64, help="refuse a shared data volume above N ranks"
    )
    parser.add_argument("--mode", choices=("async", "sync"), default="async", help="how the job saves")
    parser.add_argument("--allowed-region", action="append", default=None,
                        help="a region checkpoints may live in (repeat); a POSIX root needs --root-region")
    parser.add_argument("--allow-public", action="store_true", help="accept a public bucket (refused by default)")
    parser.add_argument("--store-private", action="store_true",
                        help="declare the store private where it has no public-access API (on-prem stores)")
    parser.add_argument("--commit", choices=("conditional", "lease"), default="conditional",
                        help="the job's commit mode: lease accepts a store without conditional writes (docs/s3.md)")
    parser.add_argument("--root-region", help="the region label of a POSIX root, for --allowed-region")
    add_pace_arguments(parser, ranks_per_node=True, store_share=True)
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    parser.set_defaults(func=run)




def run(args: argparse.Namespace) -> int:
    policy = AdmissionPolicy(
        keep_last=int_flag(args.keep_last, "--keep-last", low=0, high=MAX_KEEP_LAST),
        max_stall_s=duration_flag(args.max_stall, "--max-stall", zero=True) if args.max_stall else None,
        split_volumes_above=int_flag(args.split_volumes_above, "--split-volumes-above", low=0, high=MAX_RANKS),
    )
    pace, share = flush_pace(args), store_share(args)
    # Checked whether or not --probe is given: a bad bound is never silently ignored.
    seconds = duration_flag(args.probe_seconds, "--probe-seconds", low=MIN_PROBE_SECONDS, high=MAX_PROBE_SECONDS)
    residency = None
    if args.allowed_region or args.allow_public or args.store_private:
        residency = Residency(allowed_regions=args.allowed_region, allow_public=args.allow_public,
                              store_private=args.store_private)
    profile, caps = None, None
    if args.probe:
        if not args.root:
            raise ConfigError("--probe needs --root: the probe measures the checkpoint root")
        checkpoint_model(args)  # a bad job flag is refused before the probe writes anything
        schedule(args, mode=args.mode)
        try:  # residency before the probe writes anything
            caps = target_capabilities(args.root, residency)
        except (ResidencyError, StoreCapabilityError) as exc:
            return _report(args, Admission(admitted=False, reasons=[f"residency: {exc.message}"], root=args.root),
                           "not probed")
        with sigterm_as_interrupt():
            profile = probe(args.root, ProbeConfig(max_seconds=seconds, file_size_bytes=64 << 20),
                            residency=residency)
    job = job_from_args(args, mode=args.mode, profile=profile)
    budget = plan_burst(job.shape, job.storage, job.schedule, keep_last=policy.keep_last)
    result = admit(budget, root=args.root, data_dirs=args.data_dir, policy=policy, residency=residency,
                   root_region=args.root_region, capabilities=caps, commit=args.commit,
                   pace=plan_pace(job.shape, job.storage, budget, pace, store_share=share))
    summary = (f"{budget.ranks:,} ranks, flush {format_duration(budget.flush_s)} every "
               f"{format_duration(budget.interval_s)}")
    return _report(args, result, summary)


def _report(args: argparse.Namespace, result: Admission, summary: str) -> int:
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        verdict = "ADMIT" if result.admitted else f"REFUSE ({len(result.reasons)} reason(s))"
        print(f"ckptio admit: {verdict}: {summary}")
        for reason in result.reasons:
            print(f"refuse: {reason}")
        for warning in result.warnings:
            print(f"warn: {warning}")
        for note in result.notes:
            print(f"note: {note}")
        for name, check in (result.capabilities or {}).items():
            if isinstance(check, dict):
                verdict = {True: "yes", False: "NO", None: "unknown"}[check["ok"]]
                print(f"store: {name.replace('_', ' ')}: {verdict}: {check['detail']}")
    return 0 if result.admitted else 1
