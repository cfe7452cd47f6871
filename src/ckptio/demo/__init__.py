"""``ckptio demo``: one multi-rank training job saved four ways on one emulated shared store, then resumed.

The modules read as the demo runs: ``demo_runner`` (phases and console) → ``measure`` (this machine, before any
rank) → ``predict`` (the planner's interval and prediction) → ``launcher`` (rank processes, cleanup) → ``rank`` (one
rank: ``model`` trains, ``savers`` save on the ``throttled_store``) → ``steady`` (per-save figures: the first save
apart, steady medians, on the definitions of :mod:`ckptio.obs.report`) → ``console_tables`` (how they are shown, and
the verdict).
Beside them, ``demo_config`` (what the demo can be told, and ``--quick``) and ``dcp_best``: DCP's strongest async
path, which the benchmarks measure against too.

The package imports its runner (and with it torch) only when one of its names is first used: a benchmark that
imports ``dcp_best`` alone pays for neither, nor does every DCP checkpoint process that re-imports it."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DemoConfig", "DemoOutcome", "run_demo"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("ckptio.demo.demo_runner"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
