"""One rank's panel of the report picture: its steps as bars, its saves as spans and marks above them.

Owns the colours of step kinds and flush phases (the legend in ``obs.timeline_png`` reuses them, so a colour is
defined once). Every number it places comes from ``obs.timeline`` and ``obs.summary``; it computes none of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptio.obs.events import Phase

if TYPE_CHECKING:
    from ckptio.obs.summary import RankSummary
    from ckptio.obs.timeline import SaveTrace, StepSample, Timeline

__all__ = ["PHASE_COLOURS", "STEP_COLOURS", "STEP_LABELS", "draw_rank"]

STEP_COLOURS = {"clean": "#8da0b3", "staging": "#f28e2b", "flush": "#d1495b"}
STEP_LABELS = {
    "clean": "step (no checkpoint work)",
    "staging": "step blocked by save() staging",
    "flush": "step overlapping a flush",
}
PHASE_COLOURS: dict[str, str] = {
    Phase.SERIALIZE: "#76b7b2",
    Phase.LOCAL_WRITE: "#4e79a7",
    Phase.UPLOAD: "#1f3b73",
    Phase.RANK_INDEX: "#59a14f",
    Phase.METADATA: "#59a14f",
    Phase.MANIFEST: "#59a14f",
    Phase.RETENTION: "#bab0ac",
}
_ALARM = "#b22222"
_COMMITTED = "#2e8b57"


def span(timeline: Timeline) -> float:
    """Seconds from the run's start to its last step or event: the shared x range of every panel."""
    ends = [s.start + s.seconds for steps in timeline.steps.values() for s in steps] + list(
        timeline.end.values()
    )
    return max(ends, default=1.0) or 1.0


def draw_rank(ax: Any, rank: int, timeline: Timeline, rs: RankSummary) -> None:
    """Draw rank ``rank``'s steps, its clean-step median and its saves on ``ax``."""
    steps, saves = timeline.steps[rank], timeline.saves[rank]
    top = max((s.seconds for s in steps), default=1.0) or 1.0
    _draw_steps(ax, steps, span(timeline))
    _draw_clean_median(ax, rs.step_s["clean"]["p50"])
    lane = (top * 1.12, top * 0.2)  # the flush lane sits above the tallest bar
    for save in saves:
        _draw_save(ax, save, lane, timeline.end[rank])
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


def _draw_clean_median(ax: Any, clean: float | None) -> None:
    if not clean:
        return
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


def _draw_steps(ax: Any, steps: list[StepSample], width: float) -> None:
    """One bar per step, as wide as it lasted and as tall as its duration: a cliff is a block of tall bars.

    Drawn as one polygon collection per kind (thousands of steps stay fast); a bar narrower than a pixel or so
    is widened to stay visible and loses its white separator, which would otherwise be all that shows.
    """
    from matplotlib.collections import PolyCollection

    min_width = width / 1200
    for kind, colour in STEP_COLOURS.items():
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
                label=STEP_LABELS[kind],
            )
        )
    ax.set_xlim(-width * 0.01, width * 1.01)


def _draw_save(ax: Any, save: SaveTrace, lane: tuple[float, float], end: float) -> None:
    """A save's ``save()`` call, then either its skip or its flush and how the flush ended."""
    y, height = lane
    if save.requested is not None:
        _draw_request(ax, save, save.requested)
    if save.skipped_at is not None:
        # Above the flush lane: a skip happens while a flush runs, whose span and label sit in the lane.
        _draw_skip(ax, save, save.skipped_at, y + height * 1.9)
        return
    if save.returned is None:
        return
    flush_end = save.flush_end if save.flush_end is not None else end
    _draw_flush(ax, save, save.returned, flush_end, lane)
    if save.committed is not None:
        _draw_commit(ax, save, save.committed, lane)
    elif save.failed is not None:
        _draw_failure(ax, save, save.failed, flush_end, lane)


def _draw_request(ax: Any, save: SaveTrace, requested: float) -> None:
    stop = save.returned or save.skipped_at or requested
    ax.axvspan(requested, max(stop, requested + 1e-3), color=STEP_COLOURS["staging"], alpha=0.35, linewidth=0)


def _draw_skip(ax: Any, save: SaveTrace, at: float, y: float) -> None:
    ax.plot([at], [y], marker="X", markersize=9, color=_ALARM, linestyle="none")
    ax.annotate(
        f"skipped {save.step}",
        (at, y),
        xytext=(6, 0),
        textcoords="offset points",
        ha="left",
        va="center",
        fontsize=7.5,
        color=_ALARM,
        fontweight="bold",
    )


def _draw_flush(ax: Any, save: SaveTrace, start: float, stop: float, lane: tuple[float, float]) -> None:
    y, height = lane
    ax.broken_barh(
        [(start, stop - start)],
        (y, height),
        facecolors="#dfe6ee",
        edgecolor="#9aa8b8",
        linewidth=0.5,
        hatch="///" if save.pace_target_Bps else None,  # a paced flush: stretched on purpose
    )
    for name, phase_start, phase_stop in save.phases:
        ax.broken_barh(
            [(phase_start, phase_stop - phase_start)],
            (y + height * 0.15, height * 0.7),
            facecolors=PHASE_COLOURS.get(name, "#bab0ac"),
            linewidth=0,
        )


def _draw_commit(ax: Any, save: SaveTrace, at: float, lane: tuple[float, float]) -> None:
    y, height = lane
    ax.plot(
        [at], [y + height / 2], marker="D", markersize=6, color=_COMMITTED, markeredgecolor="white", linestyle="none"
    )
    label = f"✓ {save.step}" + (f"  {save.flush_s:.1f} s" if save.flush_s is not None else "")
    ax.annotate(
        label, (at, y + height), xytext=(0, 3), textcoords="offset points", ha="right", fontsize=7.5, color=_COMMITTED
    )


def _draw_failure(ax: Any, save: SaveTrace, reason: str, at: float, lane: tuple[float, float]) -> None:
    y, height = lane
    ax.plot([at], [y + height / 2], marker="X", markersize=9, color=_ALARM, linestyle="none")
    ax.annotate(
        f"failed {save.step}: {reason}",
        (at, y + height),
        xytext=(0, 3),
        textcoords="offset points",
        ha="right",
        fontsize=7.5,
        color=_ALARM,
    )
