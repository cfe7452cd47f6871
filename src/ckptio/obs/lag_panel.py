"""The bottom panel of the report picture: each save's flush lag against the save interval, skips marked.

A lag that climbs past the interval is the picture of a store that never catches up, so both share one axis.
Every number comes from ``obs.summary``; this module only places them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ckptio.obs.summary import Summary
    from ckptio.obs.timeline import Timeline

__all__ = ["draw_lag"]

_ALARM = "#b22222"


class LagPoint(NamedTuple):
    """One save on the lag panel; ordered by ``requested`` so the line runs left to right."""

    requested: float
    """Earliest ``save()`` call of the step over ranks."""
    lag_s: float
    """The step's flush lag (slowest rank)."""
    step: int
    """Checkpoint step."""


def draw_lag(ax: Any, timeline: Timeline, summary: Summary) -> None:
    """Draw the flush lag per save, the skipped saves and the save interval on ``ax``."""
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("seconds since the start of the run", fontsize=9)
    ax.set_ylabel("flush lag (s)", fontsize=9)
    points = lag_points(timeline, summary)
    if points:
        _plot_lags(ax, points)
    _mark_skips(ax, timeline, summary)
    if summary.median_interval_s:
        ax.axhline(
            summary.median_interval_s,
            color=_ALARM,
            linestyle="--",
            linewidth=1,
            label=f"save interval {summary.median_interval_s:.1f} s (lag above it → saves queue or skip)",
        )
    ax.set_ylim(bottom=0, top=max([p.lag_s for p in points] + [summary.median_interval_s or 0, 1e-3]) * 1.3)
    growth = summary.lag_growth_s_per_save
    title = "flush lag per save" + (f" (grows {growth:+.2f} s per save)" if growth is not None else "")
    ax.set_title(title, loc="left", fontsize=9, color="#333333")
    if points or summary.median_interval_s:
        ax.legend(fontsize=7.5, loc="best", frameon=True, framealpha=0.85, edgecolor="none")


def lag_points(timeline: Timeline, summary: Summary) -> list[LagPoint]:
    """The saves with a lag, placed at their first request; a save never requested in the events is left out."""
    points = []
    for step, lag in dict(summary.lags).items():
        requests = [
            s.requested for r in timeline.saves for s in timeline.saves[r] if s.step == step and s.requested
        ]
        if requests:
            points.append(LagPoint(min(requests), lag, step))
    return sorted(points)


def _plot_lags(ax: Any, points: list[LagPoint]) -> None:
    ax.plot(
        [p.requested for p in points],
        [p.lag_s for p in points],
        marker="o",
        color="#4e79a7",
        linewidth=1.5,
        label="flush lag: save request → commit (slowest rank)",
    )
    for p in points:
        ax.annotate(
            f"{p.lag_s:.1f}", (p.requested, p.lag_s), xytext=(0, 5), textcoords="offset points", ha="center",
            fontsize=7,
        )


def _mark_skips(ax: Any, timeline: Timeline, summary: Summary) -> None:
    skipped = [
        min(s.requested or 0 for r in timeline.saves for s in timeline.saves[r] if s.step == st)
        for st in summary.skipped_steps
    ]
    for x, step in zip(skipped, summary.skipped_steps, strict=True):
        ax.axvline(x, color=_ALARM, linewidth=1, linestyle=":")
        ax.annotate(
            f"skipped {step}",
            (x, 0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 2),
            textcoords="offset points",
            fontsize=7,
            color=_ALARM,
            va="bottom",
        )
