"""``ckptio demo``: one multi-rank training job saved three ways on one emulated shared store, then resumed.

The folders read as the demo runs: ``runner`` (phases and console) → ``predict`` (the planner's prediction)
→ ``launcher`` (rank processes, cleanup) → ``rank`` (one rank: ``model`` trains, ``savers`` save on the
throttled ``store``) → ``table`` (numbers from :mod:`ckptio.obs.report`). Importing this package imports
torch."""

from ckptio.demo.runner import DemoConfig, DemoOutcome, run_demo

__all__ = ["DemoConfig", "DemoOutcome", "run_demo"]
