"""Drawing the report: the per-rank timeline picture (PNG, matplotlib Agg) and the HTML page around it.

Owns layout, colours and the HTML table; every number it shows comes from ``obs.timeline`` and ``obs.summary``
(Timeline, Summary), so the picture and ``--json`` never disagree. Must never compute a statistic of its own beyond
what it needs to place things on the page, and never import pyplot's interactive backends (reports are drawn
on headless nodes).
"""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Any

from ckptio.errors import ConfigError
from ckptio.obs.events import Phase

if TYPE_CHECKING:
    from ckptio.obs.summary import RankSummary, Summary
    from ckptio.obs.timeline import SaveTrace, Timeline

__all__ = ["png_bytes", "write_html", "write_png"]

_STEP_COLOURS = {"clean": "#8da0b3", "staging": "#f28e2b", "flush": "#d1495b"}
_STEP_LABELS = {
    "clean": "step (no checkpoint work)",
    "staging": "step blocked by save() staging",
    "flush": "step overlapping a flush",
}
_PHASE_COLOURS: dict[str, str] = {
    Phase.SERIALIZE: "#76b7b2",
    Phase.LOCAL_WRITE: "#4e79a7",
    Phase.UPLOAD: "#1f3b73",
    Phase.RANK_INDEX: "#59a14f",
    Phase.METADATA: "#59a14f",
    Phase.MANIFEST: "#59a14f",
    Phase.RETENTION: "#bab0ac",
}
_MAX_RANK_PANELS = 8


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise ConfigError("ckptio report needs matplotlib: pip install 'ckptio[report]'") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png_bytes(timeline: Timeline, summary: Summary, *, title: str | None = None) -> bytes:
    """The timeline picture as PNG bytes."""
    plt = _pyplot()
    # With many ranks, show the ones that lost the most: the straggler is the one worth looking at.
    worst = sorted(summary.ranks, key=lambda r: -r.lost_s)[:_MAX_RANK_PANELS]
    ranks = sorted(r.rank for r in worst)
    verdicts = summary.verdicts[:5]
    header_in = 0.5 + 0.24 * len(verdicts)
    heights = [header_in] + [2.0] * len(ranks) + [1.7]
    total_in = (
        sum(heights) + 0.32 * (len(heights) - 1) + 1.0
    )  # + gaps + the legend and axis label at the bottom
    fig = plt.figure(figsize=(14, total_in), dpi=110)
    grid = fig.add_gridspec(
        len(heights),
        1,
        height_ratios=heights,
        hspace=0.3,
        top=1 - 0.15 / total_in,
        bottom=1.0 / total_in,
        left=0.065,
        right=0.93,
    )
    _draw_header(fig.add_subplot(grid[0]), verdicts, title, header_in)
    axes: list[Any] = []
    for i, rank in enumerate(ranks):
        ax = fig.add_subplot(grid[i + 1], sharex=axes[0] if axes else None)
        rank_summary = next(r for r in summary.ranks if r.rank == rank)
        _draw_rank(ax, rank, timeline, rank_summary)
        ax.tick_params(labelbottom=False)
        axes.append(ax)
    lag_ax = fig.add_subplot(grid[-1], sharex=axes[0] if axes else None)
    _draw_lag(lag_ax, timeline, summary)
    if len(timeline.steps) > len(ranks):
        lag_ax.set_title(
            f"(showing the {len(ranks)} ranks that lost the most, of {len(timeline.steps)})",
            loc="right",
            fontsize=8,
        )
    _legend(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _draw_header(ax: Any, verdicts: list[str], title: str | None, height_in: float) -> None:
    ax.axis("off")
    head = title or "ckptio report: what checkpoints cost this run"
    ax.text(0, 1, head, fontsize=14, fontweight="bold", va="top", transform=ax.transAxes)
    for i, line in enumerate(verdicts):
        colour = "#222222" if i == 0 else ("#b22222" if _alarming(line) else "#444444")
        y = (
            1 - (0.42 + 0.24 * i) / height_in
        )  # lines placed in inches so the header never overlaps the panels
        ax.text(
            0.005,
            y,
            f"{'●' if i == 0 else '▸'} {line}",
            fontsize=10,
            va="top",
            color=colour,
            fontweight="bold" if i == 0 else "normal",
            transform=ax.transAxes,
        )


def _alarming(line: str) -> bool:
    return any(
        word in line for word in ("never catches up", "failed", "skipped", "died", "disagreed", "exceeds")
    )


def _span(timeline: Timeline) -> float:
    ends = [s.start + s.seconds for steps in timeline.steps.values() for s in steps] + list(
        timeline.end.values()
    )
    return max(ends, default=1.0) or 1.0


def _draw_steps(ax: Any, steps: list[Any], span: float) -> None:
    """One bar per step, as wide as it lasted and as tall as its duration: a cliff is a block of tall bars.

    Drawn as one polygon collection per kind (thousands of steps stay fast); a bar narrower than a pixel or so
    is widened to stay visible and loses its white separator, which would otherwise be all that shows.
    """
    from matplotlib.collections import PolyCollection

    min_width = span / 1200
    for kind, colour in _STEP_COLOURS.items():
        chosen = [s for s in steps if s.kind == kind]
        if not chosen:
            continue
        boxes = []
        for s in chosen:
            x0, x1 = s.start, s.start + max(s.seconds, min_width)
            boxes.append([(x0, 0.0), (x0, s.seconds), (x1, s.seconds), (x1, 0.0)])
        narrow = sum(s.seconds < 4 * min_width for s in chosen) > len(chosen) / 2
        ax.add_collection(
            PolyCollection(
                boxes,
                facecolors=colour,
                edgecolors="none" if narrow else "white",
                linewidths=0.3,
                label=_STEP_LABELS[kind],
            )
        )
    ax.set_xlim(-span * 0.01, span * 1.01)


def _draw_rank(ax: Any, rank: int, timeline: Timeline, rs: RankSummary) -> None:
    steps, saves = timeline.steps[rank], timeline.saves[rank]
    top = max((s.seconds for s in steps), default=1.0) or 1.0
    _draw_steps(ax, steps, _span(timeline))
    clean = rs.step_s["clean"]["p50"]
    if clean:
        ax.axhline(clean, color="#333333", linestyle=(0, (4, 3)), linewidth=0.8)
        ax.text(
            1.002,
            clean,
            f"clean p50\n{1e3 * clean:.0f} ms",
            transform=ax.get_yaxis_transform(),
            fontsize=7,
            va="center",
            color="#333333",
        )
    lane = (top * 1.12, top * 0.2)  # the flush lane sits above the tallest bar
    for save in saves:
        _draw_save(ax, save, lane, top, timeline.end[rank])
    ax.set_ylim(0, top * 1.75)
    ax.set_ylabel(f"rank {rank}\nstep (s)", fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=8)
    lost = f"lost {rs.lost_s:.2f} s = {rs.blocking_s:.2f} blocked + {rs.contention_s:.2f} contention"
    ax.set_title(
        f"rank {rank}: {len(steps)} steps, {rs.committed}/{rs.saves} saves committed, {lost}",
        loc="left",
        fontsize=9,
        color="#333333",
    )


def _draw_save(ax: Any, save: SaveTrace, lane: tuple[float, float], top: float, end: float) -> None:
    y, height = lane
    if save.requested is not None:
        stop = save.returned or save.skipped_at or save.requested
        ax.axvspan(
            save.requested,
            max(stop, save.requested + 1e-3),
            color=_STEP_COLOURS["staging"],
            alpha=0.35,
            linewidth=0,
        )
    if save.skipped_at is not None:
        # Above the flush lane: a skip happens while a flush runs, whose span and label sit in the lane.
        sy = y + height * 1.9
        ax.plot([save.skipped_at], [sy], marker="X", markersize=9, color="#b22222", linestyle="none")
        ax.annotate(
            f"skipped {save.step}",
            (save.skipped_at, sy),
            xytext=(6, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=7.5,
            color="#b22222",
            fontweight="bold",
        )
        return
    if save.returned is None:
        return
    flush_end = save.flush_end if save.flush_end is not None else end
    ax.broken_barh(
        [(save.returned, flush_end - save.returned)],
        (y, height),
        facecolors="#dfe6ee",
        edgecolor="#9aa8b8",
        linewidth=0.5,
        hatch="///" if save.pace_target_Bps else None,  # a paced flush: stretched on purpose
    )
    for name, start, stop in save.phases:
        ax.broken_barh(
            [(start, stop - start)],
            (y + height * 0.15, height * 0.7),
            facecolors=_PHASE_COLOURS.get(name, "#bab0ac"),
            linewidth=0,
        )
    if save.committed is not None:
        ax.plot(
            [save.committed],
            [y + height / 2],
            marker="D",
            markersize=6,
            color="#2e8b57",
            markeredgecolor="white",
            linestyle="none",
        )
        label = f"✓ {save.step}" + (f"  {save.flush_s:.1f} s" if save.flush_s is not None else "")
        ax.annotate(
            label,
            (save.committed, y + height),
            xytext=(0, 3),
            textcoords="offset points",
            ha="right",
            fontsize=7.5,
            color="#2e8b57",
        )
    elif save.failed is not None:
        ax.plot([flush_end], [y + height / 2], marker="X", markersize=9, color="#b22222", linestyle="none")
        ax.annotate(
            f"failed {save.step}: {save.failed}",
            (flush_end, y + height),
            xytext=(0, 3),
            textcoords="offset points",
            ha="right",
            fontsize=7.5,
            color="#b22222",
        )


def _draw_lag(ax: Any, timeline: Timeline, summary: Summary) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("seconds since the start of the run", fontsize=9)
    ax.set_ylabel("flush lag (s)", fontsize=9)
    lag_by_step = dict(summary.lags)
    points = []
    for step, lag in lag_by_step.items():
        requests = [
            s.requested for r in timeline.saves for s in timeline.saves[r] if s.step == step and s.requested
        ]
        if requests:
            points.append((min(requests), lag, step))
    points.sort()
    if points:
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            color="#4e79a7",
            linewidth=1.5,
            label="flush lag: save request → commit (slowest rank)",
        )
        for x, lag, _step in points:
            ax.annotate(
                f"{lag:.1f}", (x, lag), xytext=(0, 5), textcoords="offset points", ha="center", fontsize=7
            )
    skipped = [
        min(s.requested or 0 for r in timeline.saves for s in timeline.saves[r] if s.step == st)
        for st in summary.skipped_steps
    ]
    for x, step in zip(skipped, summary.skipped_steps, strict=True):
        ax.axvline(x, color="#b22222", linewidth=1, linestyle=":")
        ax.annotate(
            f"skipped {step}",
            (x, 0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 2),
            textcoords="offset points",
            fontsize=7,
            color="#b22222",
            va="bottom",
        )
    if summary.median_interval_s:
        ax.axhline(
            summary.median_interval_s,
            color="#b22222",
            linestyle="--",
            linewidth=1,
            label=f"save interval {summary.median_interval_s:.1f} s (lag above it → saves queue or skip)",
        )
    ax.set_ylim(bottom=0, top=max([p[1] for p in points] + [summary.median_interval_s or 0, 1e-3]) * 1.3)
    growth = summary.lag_growth_s_per_save
    title = "flush lag per save" + (f" (grows {growth:+.2f} s per save)" if growth is not None else "")
    ax.set_title(title, loc="left", fontsize=9, color="#333333")
    if points or summary.median_interval_s:
        ax.legend(fontsize=7.5, loc="best", frameon=True, framealpha=0.85, edgecolor="none")


def _legend(fig: Any) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(color=c, label=_STEP_LABELS[k]) for k, c in _STEP_COLOURS.items()]
    handles += [
        Patch(facecolor="#dfe6ee", edgecolor="#9aa8b8", label="background flush (save() return → commit)"),
        Patch(facecolor="#dfe6ee", edgecolor="#9aa8b8", hatch="///", label="paced flush (flush_pace)"),
        Patch(color=_PHASE_COLOURS[Phase.SERIALIZE], label="serialize"),
        Patch(color=_PHASE_COLOURS[Phase.LOCAL_WRITE], label="local write"),
        Patch(color=_PHASE_COLOURS[Phase.UPLOAD], label="upload"),
        Patch(color=_PHASE_COLOURS[Phase.RANK_INDEX], label="index / commit"),
        Line2D([], [], marker="D", color="#2e8b57", linestyle="none", label="committed"),
        Line2D([], [], marker="X", color="#b22222", linestyle="none", label="skipped / failed"),
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=6, fontsize=7.5, frameon=False, bbox_to_anchor=(0.5, 0.0)
    )


def write_png(timeline: Timeline, summary: Summary, path: str, *, title: str | None = None) -> None:
    """Write the timeline picture to ``path``."""
    with open(path, "wb") as fh:
        fh.write(png_bytes(timeline, summary, title=title))


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


def write_html(timeline: Timeline, summary: Summary, path: str, *, title: str | None = None) -> None:
    """Write an HTML page holding the picture (embedded) and the summary tables."""
    image = base64.b64encode(png_bytes(timeline, summary, title=title)).decode()
    esc = html.escape
    verdicts = "".join(f"<li>{esc(v)}</li>" for v in summary.verdicts)
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in _rows(summary))
    head = (
        "<tr><th>rank</th><th>steps clean/staging/flush</th><th>blocked</th><th>contention</th>"
        "<th>saves committed/skipped/failed</th><th>flush median</th><th>flush MiB/s</th></tr>"
    )
    per_rank = "".join(
        f"<tr><td>{r.rank}</td><td>{r.steps['clean']}/{r.steps['staging']}/{r.steps['flush']}</td>"
        f"<td>{_fmt(r.blocking_s)}</td><td>{_fmt(r.contention_s)}</td>"
        f"<td>{r.committed}/{r.skipped}/{r.failed}</td><td>{_fmt(r.median_flush_s)}</td>"
        f"<td>{_fmt(r.flush_throughput_Bps, '', 1 / (1 << 20))}</td></tr>"
        for r in summary.ranks
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title or "ckptio report")}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1500px; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 12px; text-align: left;
         font-variant-numeric: tabular-nums; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{esc(title or "ckptio report")}</h1>
<ul class="verdicts">{verdicts}</ul>
<img alt="checkpoint timeline per rank" src="data:image/png;base64,{image}">
<h2>Summary</h2>
<table class="summary">{rows}</table>
<h2>Per rank</h2>
<table class="ranks">{head}{per_rank}</table>
</body></html>
"""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
