"""Residency: may checkpoint bytes be written to this storage at all? (contract)

Owns the rule check run before the first byte of a job is written and again every so often during the run
(a bucket policy can change under a running job): the storage's region against an allow-list, and whether
the storage is public. Both are placement capabilities of the storage (``region``, ``public_exposure()``; each
backend says what public means for its store). It must never write, and never change a store's settings; it only
reads, and only through the storage protocol.

The check is on by default: a Checkpointer, ``ckptio probe`` and ``ckptio admit`` refuse a public bucket unless
``allow_public=True`` is given explicitly, with or without a :class:`Residency` (:func:`resolve_residency`).

A bucket whose settings cannot be read is refused: a residency check that cannot see is not a pass. Two kinds
of "cannot see" are told apart: a setting this identity may not read (``ResidencyError``), and a store that has
no such API at all (``StoreCapabilityError``: most on-prem object stores). The second is passed only when the
user declares the store private (``store_private=True``); a store whose API says it is public is refused either
way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptio.errors import ConfigError, ResidencyError, StorageError, StoreCapabilityError
from ckptio.storage.base import Storage

__all__ = ["Residency", "check_residency", "resolve_residency"]


@dataclass(kw_only=True, slots=True)
class Residency:
    """Where checkpoints may be written."""

    allowed_regions: Sequence[str] | None = None
    """Regions the data may live in (``["eu-west-1", "eu-central-1"]``); None allows any region. A POSIX
    root must then carry a declared region label (``PosixStorage(..., region="eu-west-1")``)."""

    allow_public: bool = False
    """Allow a public bucket (by policy or ACL). Off by default: weights never go to a public bucket."""

    store_private: bool = False
    """Declare the store private where it has no API that could say whether it is public (no public-access
    block, policy status or ACL API). Without it such a store is refused with StoreCapabilityError."""

    def __post_init__(self) -> None:
        if isinstance(self.allowed_regions, str):
            raise ConfigError("allowed_regions must be a list of regions, not one string")
        if self.allowed_regions is not None:
            regions = tuple(self.allowed_regions)
            if not regions or not all(isinstance(r, str) and r for r in regions):
                raise ConfigError("allowed_regions must be None or a non-empty list of region names")
            self.allowed_regions = regions


def resolve_residency(
    residency: Residency | None, *, allow_public: bool = False, store_private: bool = False
) -> Residency:
    """The residency in force: ``residency`` (or the default, which refuses public buckets), with the two
    declarations added when given separately (either place counts as explicit)."""
    base = residency or Residency()
    return Residency(
        allowed_regions=base.allowed_regions,
        allow_public=base.allow_public or allow_public,
        store_private=base.store_private or store_private,
    )


def check_residency(storage: Storage, residency: Residency) -> None:
    """Raise :class:`~ckptio.errors.ResidencyError` naming the storage and the rule it breaks; else return.

    Reads the storage's placement capabilities (``region``, ``public_exposure()``); a wrapper reports its inner
    storage's, since wrappers change behaviour, never where the bytes land. A store without the API a rule needs
    raises :class:`~ckptio.errors.StoreCapabilityError` saying which API and what to declare.
    """
    if residency.allowed_regions is not None:
        _check_region(storage, residency.allowed_regions)
    if not residency.allow_public:
        _check_not_public(storage, declared_private=residency.store_private)


def _check_region(storage: Storage, allowed: Sequence[str]) -> None:
    try:
        region = storage.region
    except StoreCapabilityError as exc:
        raise StoreCapabilityError(
            f"{exc.message}, and residency allows only {list(allowed)}: ckptio cannot tell where the bytes of "
            f"{storage.url} live. Use a store that reports its region (`ckptio probe` says whether yours does), or "
            "drop allowed_regions if this store is known to be in an allowed place",
            root=storage.url,
        ) from exc
    except Exception as exc:
        raise ResidencyError(
            f"cannot read the region of {storage.url} ({exc}); rule: allowed_regions={list(allowed)}",
            root=storage.url,
        ) from exc
    if region is None:
        raise ResidencyError(
            f"{storage.url} has no region label, and residency allows only {list(allowed)}: declare the "
            f"region of this filesystem (e.g. PosixStorage(path, region=...)) or drop allowed_regions",
            root=storage.url,
        )
    if region not in allowed:
        raise ResidencyError(
            f"{storage.url} is in region {region!r}, outside allowed_regions={list(allowed)}",
            root=storage.url,
        )


def _check_not_public(storage: Storage, *, declared_private: bool) -> None:
    try:
        exposure = storage.public_exposure()
    except StoreCapabilityError as exc:
        if declared_private:
            return  # the user's declaration stands in for the API the store lacks
        raise StoreCapabilityError(
            f"cannot check whether {storage.url} is public: {exc.message}. A public bucket is refused by default "
            "(allow_public=False), and a check that cannot see is not a pass. If this store is private (the "
            "usual on-prem case), declare it: store_private=True (ckptio probe/admit: --store-private); "
            "allow_public=True skips the check altogether",
            root=storage.url,
        ) from exc
    except StorageError as exc:
        raise ResidencyError(
            f"{exc.message}; a bucket whose exposure cannot be checked is refused (rule: allow_public=False)",
            root=storage.url,
        ) from exc
    if exposure.public:
        raise ResidencyError(f"{exposure.detail}; rule: allow_public=False", root=storage.url)
