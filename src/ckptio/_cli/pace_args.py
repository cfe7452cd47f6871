"""The flush-pace flags ``plan``, ``admit`` and ``simulate`` share, and the lines ``plan`` prints about the pace.

Owns the command-line spelling of ``Checkpointer(flush_pace=, flush_pace_fraction=)`` (``--flush-pace auto|RATE``,
``--flush-pace-fraction``) and of the store share a job may take (``--store-share``). Values stay strings until
built here, so every bad value becomes a :class:`~ckptio.errors.ConfigError` naming its flag (exit code 2). The
ranges are the Checkpointer's own (``ckptio._pace_option``): the planner and a job accept the same values. The
model is :mod:`ckptio.plan.costs.pace`'s. Not a subcommand.
"""

from __future__ import annotations

import argparse

from ckptio._cli.job_args import fraction_flag, int_flag
from ckptio._pace_option import check_flush_pace, check_pace_fraction
from ckptio.errors import ConfigError
from ckptio.plan.costs.levels import DEFAULT_RANKS_PER_NODE
from ckptio.plan.costs.pace import DEFAULT_FRACTION, FlushPace, PacePlan
from ckptio.plan.units import format_duration, format_rate, parse_rate, quoted

MIN_STORE_SHARE = 1e-6
"""A smaller share of a store leaves no job a byte a second of a real one."""
MAX_RANKS_PER_NODE = 10_000


def add_pace_arguments(parser: argparse.ArgumentParser, *, ranks_per_node: bool = False,
                       store_share: bool = False) -> None:
    """The pace group; ``ranks_per_node``: add ``--ranks-per-node`` (a parser that has none yet); ``store_share``:
    add ``--store-share``."""
    g = parser.add_argument_group("flush pace (Checkpointer(flush_pace=...))")
    g.add_argument("--flush-pace", help="auto (each flush within --flush-pace-fraction of the interval), or the "
                   "node's budget as a rate (2GB/s, shared by its ranks); default: unpaced")
    g.add_argument("--flush-pace-fraction", default=str(DEFAULT_FRACTION),
                   help=f"with auto: the share of the interval a flush may take, 0-1 ({DEFAULT_FRACTION:g})")
    if ranks_per_node:
        g.add_argument("--ranks-per-node", default=str(DEFAULT_RANKS_PER_NODE),
                       help=f"ranks sharing a node's pace budget ({DEFAULT_RANKS_PER_NODE})")
    if store_share:
        g.add_argument("--store-share", help="the share of the store's write bandwidth the job may take, 0-1: "
                       "its burst (unpaced) or its paced demand is judged against it")


def flush_pace(args: argparse.Namespace) -> FlushPace:
    """``--flush-pace``, ``--flush-pace-fraction`` and ``--ranks-per-node``, checked whether or not a pace is given."""
    try:
        given_fraction: object = float(args.flush_pace_fraction)
    except ValueError:
        raise ConfigError(f"--flush-pace-fraction takes a fraction, got {quoted(args.flush_pace_fraction)}") from None
    fraction = check_pace_fraction(given_fraction, what="--flush-pace-fraction")
    per_node = int_flag(args.ranks_per_node, "--ranks-per-node", low=1, high=MAX_RANKS_PER_NODE)
    text = args.flush_pace
    if text is None:
        return FlushPace(fraction=fraction, ranks_per_node=per_node)
    if text.strip().lower() == "auto":
        return FlushPace(pace="auto", fraction=fraction, ranks_per_node=per_node)
    try:
        rate = check_flush_pace(parse_rate(text, what="--flush-pace"), what="--flush-pace")
    except ConfigError as exc:
        raise ConfigError(f"--flush-pace takes auto or the node's budget as a rate (2GB/s): {exc.message}") from None
    return FlushPace(pace=rate, fraction=fraction, ranks_per_node=per_node)


def store_share(args: argparse.Namespace) -> float | None:
    """``--store-share``, or None when not given."""
    return fraction_flag(args.store_share, "--store-share", low=MIN_STORE_SHARE) if args.store_share else None


def pace_rows(p: PacePlan) -> list[tuple[str, str, str]]:
    """``plan``'s table rows: the burst, the paced demand and, with a share, the share."""
    if p.flush_pace is None or p.flush_pace == "auto":
        how = f'{"if " if p.flush_pace is None else ""}auto at {p.flush_pace_fraction:g}'
    else:
        how = f"{format_rate(float(p.flush_pace))} a node"
    rows = [
        ("burst", format_rate(p.peak_demand_bytes_per_s),
         f"all ranks at full speed; durable in {format_duration(p.unpaced_lag_s)}"),
        ("paced demand", format_rate(p.paced_demand_bytes_per_s),
         f"{how}; durable in {format_duration(p.paced_lag_s)}, a failure loses "
         f"{format_duration(p.paced_expected_lost_work_s)} of work"),
    ]
    if p.store_share is not None and p.store_share_bytes_per_s is not None:
        fits = "fits" if p.demand_bytes_per_s <= p.store_share_bytes_per_s else "does NOT fit"
        rows.append(("store share", format_rate(p.store_share_bytes_per_s),
                     f"{p.store_share:g} of the store: the job {fits}"))
    return rows


def recommendation(p: PacePlan) -> str | None:
    """``plan``'s line recommending a pace, or None."""
    if p.recommended_flush_pace is None or p.store_share_bytes_per_s is None:
        return None
    return (f'recommend: flush_pace="{p.recommended_flush_pace}" (--flush-pace auto): the job asks '
            f"{format_rate(p.demand_bytes_per_s)} of the store, above its share of "
            f"{format_rate(p.store_share_bytes_per_s)}; each flush spread over {p.flush_pace_fraction:g} of the "
            f"interval asks {format_rate(p.auto_demand_bytes_per_s)}, within it (saves become durable later)")
