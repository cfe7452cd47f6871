"""The report: what checkpoints cost a run, computed from its JSONL events and drawn as a timeline.

The public face of the report, and the definitions every part of it uses. The parts, in pipeline order:
``obs.eventfiles`` reads the files (a bad line is a named error with file and line), ``obs.timeline`` pairs
events and attributes every training step (blocked by staging, overlapped a background flush, or neither),
``obs.summary`` computes the numbers and verdicts, ``obs.timeline_png`` draws them as a PNG (matplotlib, Agg;
its panels in ``obs.rank_panel`` and ``obs.lag_panel``) and ``obs.report_html`` as an HTML page holding the picture
and the table. None of them may touch a checkpoint or its storage: everything the report says comes from the
events.

Definitions (the docs and tests rely on them):

* A step is ``staging`` if it overlaps (by > 1 µs) a ``save()`` call on its rank (save_requested →
  save_returned/skipped), else ``flush`` if it overlaps a background flush (save_returned →
  committed/save_failed, or the end of the log), else ``clean``.
* Seconds lost on a rank = Σ ``save_returned.blocking_s`` + contention, where contention = max(0, Σ over
  flush steps of (step − mean clean step)). Ranks run in lockstep, so the job loses the max over ranks,
  not the sum.
* Flush throughput of a rank = Σ committed bytes ÷ Σ ``flush_s``; the job's = Σ bytes of all ranks ÷ Σ over
  saves of the slowest rank's ``flush_s`` (the burst bandwidth the store delivered).
* Flush lag of a save = the largest ``committed.lag_s`` over ranks; its growth is the least-squares slope of
  lag against save index.
"""

from __future__ import annotations

import os
from typing import Any

from ckptio.errors import ConfigError
from ckptio.obs.eventfiles import expand_event_paths, load_events
from ckptio.obs.summary import RankSummary, Summary, summarize, summary_to_json
from ckptio.obs.timeline import SaveTrace, StepSample, Timeline, build_timeline

__all__ = [
    "RankSummary",
    "SaveTrace",
    "StepSample",
    "Summary",
    "Timeline",
    "build_timeline",
    "expand_event_paths",
    "load_events",
    "summarize",
    "summary_to_json",
    "write_report",
]


def write_report(records: list[dict[str, Any]], out: str, *, title: str | None = None) -> Summary:
    """Summarize ``records`` and write ``out``: ``.png`` (the timeline) or ``.html`` (timeline and table)."""
    # matplotlib is optional (the ``report`` extra): import the drawing modules only to draw.
    from ckptio.obs.report_html import write_html
    from ckptio.obs.timeline_png import write_png

    ext = os.path.splitext(out)[1].lower()
    if ext not in (".png", ".html", ".htm"):
        raise ConfigError(f"report output must end in .png or .html, got {out!r}", path=out)
    timeline = build_timeline(records)
    summary = summarize(records, timeline)
    if ext == ".png":
        write_png(timeline, summary, out, title=title)
    else:
        write_html(timeline, summary, out, title=title)
    return summary
