"""The report as an HTML page: the verdicts, the picture embedded as PNG, the summary table and one row per rank.

Every number comes from ``obs.summary`` (Summary), formatted here and nowhere else, so the page and ``--json``
never disagree. Text from the events is escaped: an event file is input, not markup.
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING

from ckptio.obs.timeline_png import png_bytes

if TYPE_CHECKING:
    from ckptio.obs.summary import Summary
    from ckptio.obs.timeline import Timeline

__all__ = ["write_html"]

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1500px; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 12px; text-align: left;
         font-variant-numeric: tabular-nums; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{title}</h1>
<ul class="verdicts">{verdicts}</ul>
<img alt="checkpoint timeline per rank" src="data:image/png;base64,{image}">
<h2>Summary</h2>
<table class="summary">{rows}</table>
<h2>Per rank</h2>
<table class="ranks">{head}{per_rank}</table>
</body></html>
"""
_RANK_HEAD = (
    "<tr><th>rank</th><th>steps clean/staging/flush</th><th>blocked</th><th>contention</th>"
    "<th>saves committed/skipped/failed</th><th>flush median</th><th>flush MiB/s</th></tr>"
)


def write_html(timeline: Timeline, summary: Summary, path: str, *, title: str | None = None) -> None:
    """Write an HTML page holding the picture (embedded) and the summary tables."""
    esc = html.escape
    page = _PAGE.format(
        title=esc(title or "ckptio report"),
        verdicts="".join(f"<li>{esc(v)}</li>" for v in summary.verdicts),
        image=base64.b64encode(png_bytes(timeline, summary, title=title)).decode(),
        rows="".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in _rows(summary)),
        head=_RANK_HEAD,
        per_rank="".join(
            f"<tr><td>{r.rank}</td><td>{r.steps['clean']}/{r.steps['staging']}/{r.steps['flush']}</td>"
            f"<td>{_fmt(r.blocking_s)}</td><td>{_fmt(r.contention_s)}</td>"
            f"<td>{r.committed}/{r.skipped}/{r.failed}</td><td>{_fmt(r.median_flush_s)}</td>"
            f"<td>{_fmt(r.flush_throughput_Bps, '', 1 / (1 << 20))}</td></tr>"
            for r in summary.ranks
        ),
    )
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)


def _fmt(value: float | None, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
    return "–" if value is None else f"{value * scale:.{digits}g} {unit}".strip()


def _rows(summary: Summary) -> list[tuple[str, str]]:
    s = summary
    mib = 1 / (1 << 20)
    rows = [
        ("training time (longest rank)", _fmt(s.training_s)),
        ("lost to checkpoints", f"{_fmt(s.lost_s)} ({_fmt(s.lost_fraction, '%', 100)})"),
        ("  blocked in save()", _fmt(s.blocking_s)),
        ("  contention during flushes", _fmt(s.contention_s)),
    ]
    for kind, label in (
        ("clean", "no checkpoint work"),
        ("flush", "overlapping a flush"),
        ("staging", "blocked by staging"),
        ("all", "all steps"),
    ):
        p = s.step_s[kind]
        rows.append(
            (f"step time, {label}: p50 / p99", f"{_fmt(p['p50'], 'ms', 1e3)} / {_fmt(p['p99'], 'ms', 1e3)}")
        )
    rows += [
        ("saves requested / committed", f"{s.saves} / {s.committed}"),
        ("skipped", ", ".join(map(str, s.skipped_steps)) or "none"),
        ("failed", ", ".join(map(str, s.failed_steps)) or "none"),
        ("retries / writer deaths", f"{s.retries} / {s.writer_deaths}"),
        ("bytes committed (all ranks)", _fmt(s.bytes, "MiB", mib, 4)),
        ("flush throughput (job)", _fmt(s.flush_throughput_Bps, "MiB/s", mib)),
        ("flush lag median vs interval", f"{_fmt(s.median_lag_s)} vs {_fmt(s.median_interval_s)}"),
        ("flush lag growth per save", _fmt(s.lag_growth_s_per_save)),
    ]
    return rows
