"""The save plan of the current state structure: what each save stages, kept while the structure holds.

Planning (DCP's global planning, de-duplication across ranks, the slot layout) is collective and costs seconds on a
large state, so it runs once per *structure*: the first save, and a save whose state's fingerprint changed. Every
other save reuses the cached items and layout and only resolves the current tensors against them. A state is
flattened the quick way (``rank_plan.flatten_like_dcp``) until DCP's own flattening is once seen to disagree with it;
from then on DCP's (slower) flattening is used, since a quick flat state that names other keys than DCP's would
stage the wrong tensors.

This module decides nothing about a save (``save_decision`` agrees a planning save, ``checkpointer`` launches it)
and never talks to the writer: :meth:`PlanCache.replan` returns the message for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.planner import WriteItem

from ckptio.engine.protocol import WriterPlan
from ckptio.engine.side_group import SideGroup
from ckptio.engine.trainer.rank_plan import (
    check_supported,
    coordinated_plan,
    flatten_like_dcp,
    make_planner,
    quick_fingerprint,
    resolve_objects,
    resolve_tensors,
    statefuls_to_state_dict,
)
from ckptio.engine.trainer.staging_area import StagingArea, check_fits_on_every_rank
from ckptio.errors import CkptError, UnsupportedStateError
from ckptio.format.layout import RankLayout, plan_layout

log = logging.getLogger("ckptio")


@dataclass(frozen=True, slots=True)
class PreparedState:
    """A state as ``save`` sees it before anything is staged. A bad state is an ``error`` (to agree on, or to drop
    the save with), never raised here: a rank must not fail alone where the others would wait for it."""

    state_dict: Any
    flat: dict[str, Any]
    """The state flattened to DCP's keys."""
    key: int | None
    """The structure's fingerprint (None with an error)."""
    error: CkptError | None = None


@dataclass(frozen=True, slots=True)
class StagedItems:
    """What one save copies: this rank's tensors in layout order, and its non-tensor values already pickled."""

    tensors: list[torch.Tensor]
    objects: list[bytes]


class PlanCache:
    """This rank's plan of the current structure: write items, slot layout, and the id the writer knows it by."""

    def __init__(self, *, rank: int, group: SideGroup, file_size_bytes: int) -> None:
        self.rank, self.group, self.file_size_bytes = rank, group, file_size_bytes
        self.key: int | None = None
        """The fingerprint of the structure planned for (None before the first plan)."""
        self.plan_id = 0
        """Bumped at each plan; a job names the plan it was staged with."""
        self.layout: RankLayout | None = None
        self._fast_flatten = True
        self._tensor_items: list[WriteItem] = []
        self._object_items: list[WriteItem] = []

    def prepare(self, state: dict[str, Any]) -> PreparedState:
        """Flatten and fingerprint ``state``; check what DCP cannot save when the structure is new (before the
        agreement: a rank must not fail alone after it)."""
        try:
            state_dict = statefuls_to_state_dict(state)
            if self._fast_flatten:
                flat = flatten_like_dcp(state_dict)
            else:
                flat = make_planner(state_dict, is_coordinator=self.rank == 0).state_dict
            key = quick_fingerprint(flat)
            if key != self.key:
                check_supported(flat)
            return PreparedState(state_dict, flat, key)
        except CkptError as exc:
            return PreparedState(None, {}, None, exc)
        except Exception as exc:
            error = UnsupportedStateError(f"state cannot be planned: {type(exc).__name__}: {exc}")
            return PreparedState(None, {}, None, error)

    def needs_plan(self, prepared: PreparedState) -> bool:
        """Whether this save must plan with every rank: nothing planned yet, or the structure changed. A state
        that could not be prepared plans only when nothing is planned: the steady path drops it alone."""
        return self.key is None or (prepared.key is not None and prepared.key != self.key)

    def replan(self, prepared: PreparedState, staging: StagingArea) -> tuple[dict[str, Any], WriterPlan]:
        """DCP global planning with every rank (rank 0 coordinates). Returns the flat state to stage from (DCP's
        own, should the quick flattening ever disagree with it) and the plan for the writer. Raises before anything
        is cached when any rank's staging slots cannot fit the new layout."""
        plan = coordinated_plan(prepared.state_dict, prepared.flat, self.group)
        if plan.flattening_differed:
            log.warning("ckptio: state flattening differs from DCP's; using DCP's (slower) from now on")
            self._fast_flatten = False
        layout = plan_layout(self.rank, plan.tensor_items + plan.object_items, self.file_size_bytes)
        check_fits_on_every_rank(staging, layout, self.group)
        self._tensor_items, self._object_items, self.layout = plan.tensor_items, plan.object_items, layout
        self.key = prepared.key
        self.plan_id += 1
        return plan.flat, WriterPlan(self.plan_id, layout, metadata_skeleton=plan.metadata_skeleton)

    def items(self, flat: dict[str, Any]) -> StagedItems:
        """The current values of the planned items: tensors to copy, objects pickled now (they are not guarded)."""
        return StagedItems(resolve_tensors(flat, self._tensor_items), resolve_objects(flat, self._object_items))
