"""The job and storage flags ``plan``, ``admit`` and ``simulate`` share, and the objects built from them.

Owns the command-line spelling of a job (model, parallelism, layout, schedule) and of a store (profile or
bandwidth flags). Values stay strings until built here, so every bad value becomes a
:class:`~ckptio.errors.ConfigError` with the flag's name (exit code 2). Not a subcommand: ``main`` never
registers it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TypeVar

from ckptio.errors import ConfigError
from ckptio.plan.costs.intervals import DEFAULT_D2H_BYTES_PER_S, Schedule
from ckptio.plan.costs.store import S3_PUT_RATE_PER_PREFIX, StoreLimits
from ckptio.plan.job.checkpoint import (
    OPTIMIZER_BYTES_PER_PARAM,
    WEIGHT_DTYPE_BYTES,
    Architecture,
    CheckpointShape,
    CheckpointSpec,
    Parallelism,
    shape_checkpoint,
)
from ckptio.plan.job.presets import PRESETS, preset
from ckptio.plan.measure.profile import StorageProfile
from ckptio.plan.units import (
    check_range,
    parse_count,
    parse_duration,
    parse_int,
    parse_interval,
    parse_rate,
    parse_size,
    quoted,
)

T = TypeVar("T")
_ARCH_FLAGS = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab")
# Bounds far beyond any real job, so a typo (an extra zero run, 1e300) is a usage error, never minutes of
# arithmetic or a list of 10**17 files: the largest jobs today are ~10**5 ranks and ~10**12 parameters.
MAX_PARAMS = 1e15
MAX_RANKS = 10**7
MAX_DEGREE = 10**5
MAX_ARCH = 10**9
MAX_PREFIXES = 10**6
MAX_KEEP_LAST = 10**6
"""Committed checkpoints kept: more would need more space than any store has for any real job."""
MAX_FILES_PER_RANK = 10**6
MAX_BYTES = float(2**60)
"""An exbibyte: no checkpoint, file or tier is larger."""
MAX_BYTES_PER_S = 1e15
"""A petabyte per second: no store, tier or link is faster."""
MAX_OPS_PER_S = 1e12
MAX_SECONDS = 1e10
"""About three centuries: no interval, MTBF or cost is longer."""
# Floors for the same reason: a rate of 1e-300 B/s or a step of 1e-300 s is a typo, and the models' arithmetic
# (flush times, event horizons) is not made to survive it.
MIN_BYTES_PER_S = 1.0
MIN_OPS_PER_S = 1e-3
MIN_STEP_S = 1e-6
MIN_INTERVAL_S = 1e-3
MIN_MTBF_S = 1.0
MIN_SECONDS = 1e-6
"""The shortest duration that is not 0 (a save cost, a stall budget)."""


def size_flag(text: str, flag: str, *, low: float = 1.0, high: float = MAX_BYTES, zero: bool = False) -> float:
    """Bytes in ``flag``'s ``text`` (``300MiB``), within ``[low, high]`` (or 0 when ``zero``)."""
    return check_range(parse_size(text, what=flag), what=flag, low=low, high=high, unit=" B", zero=zero, given=text)


def rate_flag(text: str, flag: str, *, zero: bool = False) -> float:
    """Bytes per second in ``flag``'s ``text`` (``2TB/s``), within what a real store or link moves (or 0 when
    ``zero``: a plain ``0``, or nothing, then means none)."""
    value = 0.0 if zero and text.strip() in ("", "0") else parse_rate(text, what=flag)
    return check_range(value, what=flag, low=MIN_BYTES_PER_S, high=MAX_BYTES_PER_S, unit=" B/s", zero=zero,
                       given=text)


def ops_flag(text: str, flag: str) -> float:
    """Operations per second in ``flag``'s ``text`` (``3500``, ``4.2k``)."""
    return check_range(parse_count(text, what=flag), what=flag, low=MIN_OPS_PER_S, high=MAX_OPS_PER_S,
                       unit="/s", given=text)


def duration_flag(text: str, flag: str, *, low: float = MIN_SECONDS, high: float = MAX_SECONDS,
                  zero: bool = False) -> float:
    """Seconds in ``flag``'s ``text`` (``90``, ``5m``), within ``[low, high]`` (or 0 when ``zero``)."""
    return check_range(parse_duration(text, what=flag), what=flag, low=low, high=high, unit=" s", zero=zero,
                       given=text)


def fraction_flag(text: str, flag: str, *, low: float) -> float:
    """A fraction in (0, 1] in ``flag``'s ``text``, no smaller than ``low``."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{flag} takes a fraction in (0, 1], got {quoted(text)}") from None
    if not 0 < value <= 1:
        raise ConfigError(f"{flag} must be within (0, 1], got {quoted(text)}")
    return check_range(value, what=flag, low=low, high=1.0, given=text)


def interval_flag(text: str, flag: str, *, step_time_s: float | None) -> float:
    """Seconds of compute in ``flag``'s ``text``, given in steps (``500``, with a step time) or as a duration."""
    seconds = parse_interval(text, step_time_s=step_time_s, what=flag)[0]
    return check_range(seconds, what=flag, low=MIN_INTERVAL_S, high=MAX_SECONDS, unit=" s", given=text)


def int_flag(value: int | str, flag: str, *, low: int, high: int) -> int:
    """A whole number for ``flag``, within ``[low, high]``."""
    return parse_int(value, what=flag, minimum=low, maximum=high)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, parallelism, file layout and schedule of the job."""
    model = parser.add_argument_group("model (a preset, a parameter count, or an architecture)")
    model.add_argument("--preset", choices=sorted(PRESETS), help="an MLPerf Storage checkpoint workload")
    model.add_argument("--params", help="parameter count: 8e9, 8B, 405.9B, 1.2T")
    for name in _ARCH_FLAGS:
        model.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"architecture: {name}")
    model.add_argument("--weights-dtype", choices=sorted(WEIGHT_DTYPE_BYTES), help="saved weights (bf16)")
    model.add_argument(
        "--optimizer", choices=sorted(OPTIMIZER_BYTES_PER_PARAM), help="saved optimizer state (adam-mixed)"
    )
    model.add_argument("--extra-bytes", default="0", help="extra bytes every rank saves (RNG, loader state)")
    par = parser.add_argument_group("parallelism")
    par.add_argument("--ranks", type=int, help="ranks in the job (default tp × pp × dp)")
    par.add_argument("--tp", type=int, help="tensor-parallel degree (1)")
    par.add_argument("--pp", type=int, help="pipeline-parallel degree (1)")
    par.add_argument("--dp", type=int, help="data-parallel degree (ranks ÷ (tp × pp))")
    par.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (0)")
    lay = parser.add_argument_group("layout")
    lay.add_argument("--file-size", default="1GiB", help="target data file size per rank (1GiB)")
    lay.add_argument("--part-size", default="64MiB", help="multipart part size on object stores (64MiB)")
    sched = parser.add_argument_group("schedule")
    sched.add_argument("--step-time", help="seconds per training step (to read --interval in steps)")
    sched.add_argument("--interval", help="steps (500, with --step-time) or a duration (30m); default Daly's")
    sched.add_argument("--mtbf", help="mean time between failures (default: Llama 3's rate, scaled to ranks)")
    sched.add_argument("--save-cost", help="blocking seconds per checkpoint (overrides the D2H estimate)")
    sched.add_argument("--d2h-bandwidth", default=None,
                       help=f"device-to-host copy per rank ({DEFAULT_D2H_BYTES_PER_S / 1e9:g}GB/s)")


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """The store: a probe profile, or bandwidth flags (flags override the profile's figures)."""
    st = parser.add_argument_group("storage (a --profile from `ckptio probe`, or bandwidths)")
    st.add_argument("--profile", help="storage profile JSON written by `ckptio probe --out`")
    st.add_argument("--write-bandwidth", help="aggregate write bandwidth: 2TB/s, 300MiB/s")
    st.add_argument("--per-writer-bandwidth", help="cap of one rank's writer")
    st.add_argument("--read-bandwidth", help="aggregate read bandwidth (restore estimate)")
    st.add_argument("--metadata-ops", help="metadata operations per second (POSIX)")
    st.add_argument("--storage-kind", choices=("posix", "object"), help="default: the profile's, else posix")
    st.add_argument("--put-rate-per-prefix", help=f"PUT requests/s per prefix ({S3_PUT_RATE_PER_PREFIX:g})")
    st.add_argument("--prefixes", type=int, default=1, help="prefixes the ranks spread over (1)")
    st.add_argument("--serialize-bandwidth", help="one writer's serialize+checksum rate (profile's)")


def checkpoint_model(args: argparse.Namespace) -> CheckpointSpec:
    """The job's checkpoint from ``--preset``, ``--params`` or the architecture flags."""
    arch_given = [n for n in _ARCH_FLAGS if getattr(args, n) is not None]
    _check_int_flags(args, arch_given)
    sources = sum(bool(x) for x in (args.preset, args.params, arch_given))
    if sources != 1:
        raise ConfigError("describe the model once: --preset NAME, --params N, or the architecture flags")
    base = preset(args.preset) if args.preset else None
    architecture = base.architecture if base else _architecture(args, arch_given)
    parallelism = Parallelism.for_ranks(
        ranks=args.ranks if args.ranks is not None or base is None else None,
        tp=_pick(args.tp, base.parallelism.tp if base else 1),
        pp=_pick(args.pp, base.parallelism.pp if base else 1),
        dp=args.dp if args.dp is not None or base is None or args.ranks is not None else base.parallelism.dp,
        zero=_pick(args.zero, base.parallelism.zero if base else 0),
    )
    model = CheckpointSpec(
        params=_params(args.params) if args.params else None,
        architecture=architecture,
        weights_dtype=_pick(args.weights_dtype, base.weights_dtype if base else "bf16"),
        optimizer=_pick(args.optimizer, base.optimizer if base else "adam-mixed"),
        extra_bytes_per_rank=size_flag(args.extra_bytes, "--extra-bytes", zero=True),
        parallelism=parallelism,
        file_size_bytes=size_flag(args.file_size, "--file-size", low=float(1 << 20)),
        part_size_bytes=size_flag(args.part_size, "--part-size", low=float(1 << 20)),
    )
    _check_size(model)
    return model


def _check_int_flags(args: argparse.Namespace, arch_given: list[str]) -> None:
    """Integer flags from 1 to :data:`MAX_RANKS` and friends (argparse only checked that they are integers)."""
    bounds = {"ranks": MAX_RANKS, "dp": MAX_RANKS, "tp": MAX_DEGREE, "pp": MAX_DEGREE}
    bounds.update(dict.fromkeys(arch_given, MAX_ARCH))
    for name, top in bounds.items():
        value = getattr(args, name)
        if value is not None:
            int_flag(value, f"--{name.replace('_', '-')}", low=1, high=top)


def _params(text: str) -> float:
    return check_range(parse_count(text, what="--params"), what="--params", low=1.0, high=MAX_PARAMS, given=text)


def _check_size(model: CheckpointSpec) -> None:
    """Refuse a model too large to be real before it is shaped (shaping lists every file of a rank)."""
    if model.param_count > MAX_PARAMS:
        raise ConfigError(f"{model.param_count:.3g} parameters is beyond any real model (at most {MAX_PARAMS:.0e})")
    if model.parallelism.ranks > MAX_RANKS:
        raise ConfigError(f"{model.parallelism.ranks:,} ranks is beyond any real job (at most {MAX_RANKS:,})")
    per_param = WEIGHT_DTYPE_BYTES[model.weights_dtype] + OPTIMIZER_BYTES_PER_PARAM[model.optimizer]
    largest = max(model.stage_params()) / model.parallelism.tp * per_param + model.extra_bytes_per_rank
    files = largest / model.file_size_bytes
    if files > MAX_FILES_PER_RANK:
        raise ConfigError(f"a rank would write {files:.3g} files of --file-size {model.file_size_bytes:.3g} "
                          f"bytes (at most {MAX_FILES_PER_RANK:,}): raise --file-size, or check --params and "
                          "--extra-bytes")


def _pick(given: T | None, default: T) -> T:
    return default if given is None else given


def _architecture(args: argparse.Namespace, given: list[str]) -> Architecture | None:
    if not given:
        return None
    values = {n: getattr(args, n) for n in _ARCH_FLAGS}
    if values["kv_heads"] is None:
        values["kv_heads"] = values["heads"]
    missing = [f"--{n.replace('_', '-')}" for n, v in values.items() if v is None]
    if missing:
        raise ConfigError(f"an architecture needs {', '.join(missing)} too")
    return Architecture(**values)


def schedule(args: argparse.Namespace, *, mode: str) -> Schedule:
    step_time = duration_flag(args.step_time, "--step-time", low=MIN_STEP_S) if args.step_time else None
    return Schedule(
        interval_s=interval_flag(args.interval, "--interval", step_time_s=step_time) if args.interval else None,
        step_time_s=step_time,
        mtbf_s=duration_flag(args.mtbf, "--mtbf", low=MIN_MTBF_S) if args.mtbf else None,
        save_cost_s=duration_flag(args.save_cost, "--save-cost", zero=True) if args.save_cost else None,
        d2h_bytes_per_s=rate_flag(args.d2h_bandwidth, "--d2h-bandwidth") if args.d2h_bandwidth
        else DEFAULT_D2H_BYTES_PER_S,
        mode=mode,  # type: ignore[arg-type]
    )


def storage_model(args: argparse.Namespace, profile: StorageProfile | None = None) -> StoreLimits:
    """The store from ``profile`` (or ``--profile``), each figure overridable by its flag."""
    if profile is None and args.profile:
        profile = StorageProfile.load(args.profile)
    write = _rate(args.write_bandwidth, "--write-bandwidth")
    if write is None and profile is None:
        raise ConfigError("give the store: --profile FILE (from `ckptio probe --out`) or --write-bandwidth")
    per_writer = _rate(args.per_writer_bandwidth, "--per-writer-bandwidth")
    prefixes = int_flag(args.prefixes, "--prefixes", low=1, high=MAX_PREFIXES)
    model = StoreLimits(
        write_bytes_per_s=write or (profile.write_bytes_per_s if profile else math.inf),
        per_writer_bytes_per_s=per_writer or (profile.per_writer_bytes_per_s if profile else math.inf),
        read_bytes_per_s=_rate(args.read_bandwidth, "--read-bandwidth")
        or (profile.read_bytes_per_s if profile else None),
        metadata_ops_per_s=(
            ops_flag(args.metadata_ops, "--metadata-ops")
            if args.metadata_ops
            else (profile.metadata_ops_per_s if profile else None)
        ),
        # The flag replaces the probe's figures, per kind too: one rate for every kind.
        metadata_rates={} if args.metadata_ops or profile is None else dict(profile.metadata),
        kind=args.storage_kind or (profile.kind if profile else "posix"),
        put_rate_per_prefix=(
            ops_flag(args.put_rate_per_prefix, "--put-rate-per-prefix")
            if args.put_rate_per_prefix
            else S3_PUT_RATE_PER_PREFIX
        ),
        prefixes=prefixes,
        serialize_bytes_per_s=_rate(args.serialize_bandwidth, "--serialize-bandwidth")
        or (profile.serialize_bytes_per_s if profile and profile.serialize_bytes_per_s else math.inf),
    )
    # Checked on the model too, so a figure from a profile meets the same bounds as one from a flag (``inf``: a
    # figure left out of the model, never a measurement).
    for value, flag, floor, ceiling, unit in (
        (model.write_bytes_per_s, "--write-bandwidth", MIN_BYTES_PER_S, MAX_BYTES_PER_S, "B/s"),
        (model.per_writer_bytes_per_s, "--per-writer-bandwidth", MIN_BYTES_PER_S, MAX_BYTES_PER_S, "B/s"),
        (model.read_bytes_per_s, "--read-bandwidth", MIN_BYTES_PER_S, MAX_BYTES_PER_S, "B/s"),
        (model.serialize_bytes_per_s, "--serialize-bandwidth", MIN_BYTES_PER_S, MAX_BYTES_PER_S, "B/s"),
        (model.metadata_ops_per_s, "--metadata-ops", MIN_OPS_PER_S, MAX_OPS_PER_S, "ops/s"),
        (model.put_rate_per_prefix, "--put-rate-per-prefix", MIN_OPS_PER_S, MAX_OPS_PER_S, "requests/s"),
    ):
        _within(value, floor, ceiling, flag, unit, profile=profile is not None)
    return model


def _within(value: float | None, floor: float, ceiling: float, flag: str, unit: str, *, profile: bool) -> None:
    if value is None or math.isinf(value) or floor <= value <= ceiling:
        return
    source = f"{flag} (or the profile's figure)" if profile else flag
    side = f"below {floor:g} {unit}" if value < floor else f"above {ceiling:g} {unit}"
    raise ConfigError(f"{source} is {value:.3g} {unit}: {side}, which no real job or store has")


def _rate(text: str | None, flag: str) -> float | None:
    return rate_flag(text, flag) if text else None


@dataclass(kw_only=True, slots=True, frozen=True)
class Job:
    """Everything the flags describe, built and validated."""

    model: CheckpointSpec
    """The checkpoint's contents and parallelism."""

    shape: CheckpointShape
    """Bytes and objects per rank class."""

    storage: StoreLimits
    """The store's caps."""

    schedule: Schedule
    """Interval, MTBF and save costs."""


def job_from_args(args: argparse.Namespace, *, mode: str, profile: StorageProfile | None = None) -> Job:
    model = checkpoint_model(args)
    return Job(
        model=model,
        shape=shape_checkpoint(model),
        storage=storage_model(args, profile),
        schedule=schedule(args, mode=mode),
    )
