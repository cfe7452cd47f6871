"""What ``save`` works out on the training thread before anything is staged: the request it serves, and — for a
planning save only — the collective agreement (the state's flat form and fingerprint are ``plan_cache``'s).

A *planning* save (the first one, or one whose state structure changed) re-plans with every rank, so it is agreed
with every rank first: a bounded barrier (a structure change on some ranks only is a
:class:`~ckptio.errors.ConfigError` naming the rule, never a hang), then save/skip/block with one tiny all-reduce.
The rule this relies on, true of SPMD training: **a structure change happens on every rank at the same step**.
Every other save decides on its own rank (``Checkpointer._save``). This module never stages and never talks to the
writer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptio.engine.protocol import JobLevels
from ckptio.engine.side_group import Agreement, SideGroup
from ckptio.engine.trainer.staging_area import StagingArea


@dataclass(frozen=True, slots=True)
class SaveRequest:
    """One ``save`` call as the ranks know it: the same on every rank, since every rank calls ``save`` together."""

    step: int
    save_id: int
    """Derived alike on every rank from the run's nonce and the call's ordinal (``side_group.SaveIds``)."""
    levels: JobLevels
    emergency: bool = False
    """An emergency save (after a SIGTERM, or ``emergency_save``): local level only, never paced, and never
    itself turned into another emergency save."""


def agree_to_plan(group: SideGroup, staging: StagingArea, *, step: int, timeout_s: float, overflow: str,
                  error: bool) -> Agreement:
    """Agree a planning save with every rank; with overflow="block" wait for this rank's slot and agree again."""
    group.gate(timeout_s, f"the planning save of step {step}")
    while True:
        agreed = group.agree(free=staging.free_slot_id() is not None, changed=True, error=error)
        if agreed.all_free or agreed.any_error or overflow == "skip":
            return agreed
        staging.wait_free(timeout=1.0)
