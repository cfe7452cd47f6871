"""What ``save`` works out on the training thread before anything is staged: the state's flat form and
fingerprint, and — for a planning save only — the collective agreement.

A *planning* save (the first one, or one whose state structure changed) re-plans with every rank, so it is agreed
with every rank first: a bounded barrier (a structure change on some ranks only is a
:class:`~ckptio.errors.ConfigError` naming the rule, never a hang), then save/skip/block with one tiny all-reduce.
The rule this relies on, true of SPMD training: **a structure change happens on every rank at the same step**.
Every other save decides on its own rank (``Checkpointer._save``). This module never stages and never talks to the
writer.
"""

from __future__ import annotations

from typing import Any

from ckptio.engine.side_group import Agreement, SideGroup
from ckptio.engine.trainer.rank_plan import (
    check_supported,
    flatten_like_dcp,
    make_planner,
    quick_fingerprint,
    statefuls_to_state_dict,
)
from ckptio.engine.trainer.staging_area import StagingArea
from ckptio.errors import CkptError, UnsupportedStateError


def prepare_state(state: dict[str, Any], *, plan_key: int | None, fast: bool,
                  rank: int) -> tuple[Any, dict[str, Any], int | None, CkptError | None]:
    """Flatten and fingerprint the state: (state dict, flat state, fingerprint, error). A bad state is returned as
    an error (to agree on, or to drop the save with), not raised."""
    try:
        state_dict = statefuls_to_state_dict(state)
        flat = flatten_like_dcp(state_dict) if fast else make_planner(state_dict, is_coordinator=rank == 0).state_dict
        key = quick_fingerprint(flat)
        if key != plan_key:
            check_supported(flat)  # before the agreement: a rank must not fail alone after it
        return state_dict, flat, key, None
    except CkptError as exc:
        return None, {}, None, exc
    except Exception as exc:
        return None, {}, None, UnsupportedStateError(f"state cannot be planned: {type(exc).__name__}: {exc}")


def agree_to_plan(group: SideGroup, staging: StagingArea, *, step: int, timeout_s: float, overflow: str,
                  error: bool) -> Agreement:
    """Agree a planning save with every rank; with overflow="block" wait for this rank's slot and agree again."""
    group.gate(timeout_s, f"the planning save of step {step}")
    while True:
        agreed = group.agree(free=staging.free_slot_id() is not None, changed=True, error=error)
        if agreed.all_free or agreed.any_error or overflow == "skip":
            return agreed
        staging.wait_free(timeout=1.0)
