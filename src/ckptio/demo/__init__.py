"""``ckptio demo``: one multi-rank training job saved four ways on one emulated shared store, then resumed.

The modules read as the demo runs: ``runner`` (phases and console) → ``measure`` (this machine, before any rank) →
``predict`` (the planner's interval and prediction) → ``launcher`` (rank processes, cleanup) → ``rank`` (one rank:
``model`` trains, ``savers`` save on the throttled ``store``) → ``steady`` (per-save figures: the first save apart,
steady medians, on the definitions of :mod:`ckptio.obs.report`) → ``table`` (how they are shown, and the verdict).
Importing this package imports torch."""

from ckptio.demo.runner import DemoConfig, DemoOutcome, run_demo

__all__ = ["DemoConfig", "DemoOutcome", "run_demo"]
