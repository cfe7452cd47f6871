"""The admission gate: may this job start on this store? Every refusal with its reason, before a GPU idles.

Owns the refusal rules of ``ckptio admit`` (contract: each rule below is one line of output when it fires):

* the flush cannot finish within the interval (the queue would grow until saves block or are skipped);
* the metadata work of a save and its commit (:mod:`ckptio.plan.costs.commit_metadata`) outlasts the interval;
* the per-checkpoint stall is above the budget (``max_stall_s``, default a tenth of the interval);
* the root's free space is below ``keep_last + 1`` checkpoints (retention deletes only after a commit);
* the burst needs more PUT requests per second than the prefixes sustain (object stores);
* the job asks more of the store than its share (a :class:`~ckptio.plan.costs.pace.PacePlan` judged against
  ``--store-share``): unpaced, its burst (the refusal says whether ``flush_pace="auto"`` would fit); paced, its
  paced demand. A paced job whose burst alone would not fit is admitted with a note naming both figures;
* checkpoints share the dataset's volume and the gang is larger than ``split_volumes_above`` ranks;
* the root is under $HOME;
* the root breaks residency (:mod:`ckptio.policy.residency`: a public bucket, a region outside the list), or its
  store has no API to tell and is not declared private (``store_private``);
* the store lacks a capability the job needs (:mod:`ckptio.storage.capabilities`: conditional writes unless
  ``commit="lease"``, objects written in parts, ranged reads), when its capabilities are known (``--probe``).

It must never write to the root (``--probe`` writes only through :mod:`ckptio.plan.measure.probe`, which checks
residency first and cleans up).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ckptio.errors import AdmissionError, ConfigError, ResidencyError, StoreCapabilityError
from ckptio.plan.costs.budget import BurstBudget
from ckptio.plan.costs.pace import PacePlan
from ckptio.plan.units import format_bytes, format_duration, format_rate
from ckptio.policy.residency import Residency, check_residency
from ckptio.policy.volumes import check_volumes, volume_of
from ckptio.storage import PosixRoot, Root, open_storage, parse_root
from ckptio.storage.capabilities import StoreCapabilities, capability_problems

DEFAULT_STALL_SHARE = 0.10


@dataclass(kw_only=True, slots=True)
class AdmissionPolicy:
    """The limits a job must stay within to be admitted."""

    keep_last: int = 3
    """Committed checkpoints kept; the root must hold this many plus the one being written."""

    max_stall_s: float | None = None
    """Most training seconds one checkpoint may stall; None allows a tenth of the interval."""

    split_volumes_above: int = 64
    """Gangs above this many ranks must not checkpoint onto the dataset's volume."""

    def __post_init__(self) -> None:
        if self.keep_last < 0:
            raise ConfigError(f"keep_last must be >= 0, got {self.keep_last}")
        if self.max_stall_s is not None and self.max_stall_s < 0:
            raise ConfigError(f"max stall must be >= 0, got {self.max_stall_s}")
        if self.split_volumes_above < 0:
            raise ConfigError(f"split_volumes_above must be >= 0, got {self.split_volumes_above}")


@dataclass(kw_only=True, slots=True)
class Admission:
    """The gate's answer (``ckptio admit --json`` prints these keys, with the plan under ``plan``)."""

    admitted: bool
    """True when no rule refuses the job."""

    reasons: list[str] = field(default_factory=list)
    """One line per refusal, saying what to change."""

    warnings: list[str] = field(default_factory=list)
    """Findings that do not refuse the job (the plan's warnings, a RAM root)."""

    root: str | None = None
    """The checkpoint root checked."""

    free_bytes: float | None = None
    """Free space at the root's volume (POSIX roots)."""

    needed_bytes: float | None = None
    """Space ``keep_last + 1`` checkpoints take."""

    fs_type: str | None = None
    """Filesystem type of the root."""

    notes: list[str] = field(default_factory=list)
    """Why a rule that could have refused did not (a paced job whose burst alone exceeds the store share)."""

    plan: BurstBudget | None = None
    """The planner's budget the decision rests on."""

    pace: PacePlan | None = None
    """The burst and the paced demand the store-share rule judged, when a share was given."""

    capabilities: dict[str, Any] | None = None
    """What the store honours (:meth:`StoreCapabilities.to_json`), when it was probed (``--probe``)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def raise_if_refused(self) -> None:
        """Raise :class:`~ckptio.errors.AdmissionError` listing every reason, when refused."""
        if not self.admitted:
            raise AdmissionError("; ".join(self.reasons), root=self.root)


def admit(
    budget: BurstBudget,
    *,
    root: str | None = None,
    data_dirs: tuple[str, ...] | list[str] = (),
    policy: AdmissionPolicy | None = None,
    home: str | None = None,
    residency: Residency | None = None,
    root_region: str | None = None,
    capabilities: StoreCapabilities | None = None,
    commit: Literal["conditional", "lease"] = "conditional",
    pace: PacePlan | None = None,
) -> Admission:
    """Decide whether the job ``budget`` describes may start with its checkpoints at ``root``.

    ``residency`` is checked against the root (a root that is not a directory of this host always: by default a
    public bucket is refused); ``root_region`` labels a directory root for an ``allowed_regions`` rule.
    ``capabilities`` (from the probe) refuse a store that lacks what the job's ``commit`` mode needs. ``pace`` (with
    a store share) refuses a job that asks more of the store than its share.
    """
    policy = policy or AdmissionPolicy()
    result = Admission(admitted=True, root=root, plan=budget)
    result.reasons.extend(_burst_reasons(budget, policy))
    if pace is not None and pace.store_share is not None:
        result.pace = pace
        _share_rule(result, pace)
    if capabilities is not None:
        result.capabilities = capabilities.to_json()
        result.reasons.extend(f"store: {problem}" for problem in capability_problems(capabilities, commit=commit))
    spec = parse_root(root) if root is not None else None
    if spec is not None and (residency is not None or not isinstance(spec, PosixRoot)):
        _check_residency(result, spec, residency or Residency(), root_region)
    if isinstance(spec, PosixRoot):
        _check_root(result, budget, spec.path, data_dirs=list(data_dirs), policy=policy, home=home)
    elif root is None and data_dirs:
        raise ConfigError("--data-dir needs --root: the check compares the two volumes")
    # The plan's findings that are not refusals already (those say the same thing once).
    refused_codes = {"flush-behind", "put-rate", "metadata"}
    findings = zip(budget.reason_codes, budget.reasons, strict=True)
    result.warnings.extend(message for code, message in findings if code not in refused_codes)
    result.admitted = not result.reasons
    return result


def _burst_reasons(b: BurstBudget, policy: AdmissionPolicy) -> list[str]:
    out = []
    if not b.keeps_up:
        out.append(
            f"flush cannot finish within the interval: {format_duration(b.flush_s)} to write "
            f"{format_bytes(b.checkpoint_bytes)} ({b.bottleneck}) but saves come every "
            f"{format_duration(b.interval_s)}; needs {format_rate(b.checkpoint_bytes / b.interval_s)} "
            "of write bandwidth or a longer interval"
        )
    budget_s = policy.max_stall_s if policy.max_stall_s is not None else DEFAULT_STALL_SHARE * b.interval_s
    if b.keeps_up and b.stall_s_per_checkpoint > budget_s:
        kind = "synchronous stall" if b.mode == "sync" else "stall"
        out.append(
            f"{kind} of {format_duration(b.stall_s_per_checkpoint)} per checkpoint is above the budget of "
            f"{format_duration(budget_s)}"
            + ("; save asynchronously" if b.mode == "sync" else "; speed up the device-to-host copy")
        )
    if "metadata" in b.reason_codes:  # on the store's own rates; a time from the defaults only warns
        per_save, per_commit = (sum(b.metadata_ops[part].values()) for part in ("per_save", "per_commit"))
        out.append(
            f"metadata of a save and its commit take {format_duration(b.commit_metadata_s)} "
            f"({per_save:,} storage operations per save, {per_commit:,} per commit) but saves come every "
            f"{format_duration(b.interval_s)}, so commits would fall behind; write fewer, larger files per rank, "
            "keep fewer checkpoints (--keep-last) or use a store with a faster metadata service"
        )
    if b.storage_kind == "object" and b.put_requests_per_s > b.put_rate_limit:
        out.append(
            f"PUT rate over the per-prefix limit: the burst needs {b.put_requests_per_s:,.0f} requests/s and "
            f"the prefixes take {b.put_rate_limit:,.0f}/s; spread over more prefixes or use larger files"
        )
    return out


def _share_rule(result: Admission, p: PacePlan) -> None:
    """The store-share rule: the job's demand as set against ``store_share`` × the store's write bandwidth."""
    assert p.store_share_bytes_per_s is not None
    share = f"{p.store_share:g} × the store's write bandwidth = {format_rate(p.store_share_bytes_per_s)}"
    burst = f"burst of {format_rate(p.peak_demand_bytes_per_s)} (every rank writing at full speed)"
    fits = p.store_share_bytes_per_s
    if not p.paced:
        if p.peak_demand_bytes_per_s <= fits:
            return
        auto = (f'flush_pace="auto" would spread it to {format_rate(p.auto_demand_bytes_per_s)} over '
                f"{p.flush_pace_fraction:g} of the interval")
        fix = (f"{auto}, within the share: pace the flushes "
               '(Checkpointer(flush_pace="auto")) and admit with --flush-pace auto'
               if p.auto_demand_bytes_per_s <= fits else f"even {auto}: lengthen the interval or raise the share")
        result.reasons.append(f"store share: {burst} is above {share}; {fix}")
        return
    paced = f"paced demand of {format_rate(p.paced_demand_bytes_per_s)} (flush_pace={_label(p)})"
    if p.paced_demand_bytes_per_s > fits:
        result.reasons.append(f"store share: {paced} is above {share} (its {burst}); lengthen the interval, lower "
                              "the pace or raise the share")
    elif p.peak_demand_bytes_per_s > fits:
        result.notes.append(f"store share: {burst} is above {share}, but the job paces its flushes: {paced} fits "
                            f"(durable {format_duration(p.paced_lag_s)} after each save instead of "
                            f"{format_duration(p.unpaced_lag_s)})")


def _label(p: PacePlan) -> str:
    if p.flush_pace == "auto":
        return f'"auto", fraction {p.flush_pace_fraction:g}'
    return f"{format_rate(float(p.flush_pace or 0.0))} a node"


def _check_residency(result: Admission, root: Root, residency: Residency, region: str | None) -> None:
    # A directory cannot tell its region: the user's label stands in. Other stores read their own.
    options: dict[str, Any] = {"region": region} if isinstance(root, PosixRoot) else {}
    storage = open_storage(root, **options)
    try:
        check_residency(storage, residency)
    except (ResidencyError, StoreCapabilityError) as exc:
        result.reasons.append(f"residency: {exc.message}")
    finally:
        storage.close()


def _check_root(
    result: Admission,
    b: BurstBudget,
    path: str,
    *,
    data_dirs: list[str],
    policy: AdmissionPolicy,
    home: str | None,
) -> None:
    volume = volume_of(path)
    result.free_bytes = float(volume.free_bytes)
    result.fs_type = volume.fs_type
    result.needed_bytes = (policy.keep_last + 1) * b.checkpoint_bytes
    if result.free_bytes < result.needed_bytes:
        result.reasons.append(
            f"free space below keep_last + 1 checkpoints: {format_bytes(result.free_bytes)} free at "
            f"{volume.mount.mount_point if volume.mount else volume.existing}, "
            f"{policy.keep_last + 1} × {format_bytes(b.checkpoint_bytes)} = "
            f"{format_bytes(result.needed_bytes)} needed"
        )
    for finding in check_volumes(path, data_dirs, home=home):
        if finding.code == "root-under-home":
            result.reasons.append(f"root under $HOME: {finding.message}")
        elif finding.code == "root-on-data-volume" and b.ranks > policy.split_volumes_above:
            result.reasons.append(
                f"checkpoints on the dataset volume for a gang of {b.ranks} ranks "
                f"(> {policy.split_volumes_above}): {finding.message}"
            )
        else:
            result.warnings.append(finding.message)
    result.root = os.path.abspath(path)
