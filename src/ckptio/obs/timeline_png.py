"""The report picture (PNG, matplotlib Agg): a header of verdicts, one panel per rank, the lag panel, a legend.

Owns the page layout; the panels are drawn by ``obs.rank_panel`` and ``obs.lag_panel``. Every number shown comes
from ``obs.timeline`` and ``obs.summary`` (Timeline, Summary), so the picture and ``--json`` never disagree. Must
never import pyplot's interactive backends: reports are drawn on headless nodes.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from ckptio.errors import ConfigError
from ckptio.obs.events import Phase
from ckptio.obs.lag_panel import draw_lag
from ckptio.obs.rank_panel import PHASE_COLOURS, STEP_COLOURS, STEP_LABELS, draw_rank

if TYPE_CHECKING:
    from ckptio.obs.summary import Summary
    from ckptio.obs.timeline import Timeline

__all__ = ["png_bytes", "write_png"]

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
    fig, grid = _figure(plt, header_in, len(ranks))
    _draw_header(fig.add_subplot(grid[0]), verdicts, title, header_in)
    axes: list[Any] = []
    for i, rank in enumerate(ranks):
        ax = fig.add_subplot(grid[i + 1], sharex=axes[0] if axes else None)
        draw_rank(ax, rank, timeline, next(r for r in summary.ranks if r.rank == rank))
        ax.tick_params(labelbottom=False)
        axes.append(ax)
    lag_ax = fig.add_subplot(grid[-1], sharex=axes[0] if axes else None)
    draw_lag(lag_ax, timeline, summary)
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


def write_png(timeline: Timeline, summary: Summary, path: str, *, title: str | None = None) -> None:
    """Write the timeline picture to ``path``."""
    with open(path, "wb") as fh:
        fh.write(png_bytes(timeline, summary, title=title))


def _figure(plt: Any, header_in: float, n_ranks: int) -> tuple[Any, Any]:
    """The figure and its grid: the header, ``n_ranks`` panels and the lag panel, laid out in inches."""
    heights = [header_in] + [2.0] * n_ranks + [1.7]
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
    return fig, grid


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


def _legend(fig: Any) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(color=c, label=STEP_LABELS[k]) for k, c in STEP_COLOURS.items()]
    handles += [
        Patch(facecolor="#dfe6ee", edgecolor="#9aa8b8", label="background flush (save() return → commit)"),
        Patch(facecolor="#dfe6ee", edgecolor="#9aa8b8", hatch="///", label="paced flush (flush_pace)"),
        Patch(color=PHASE_COLOURS[Phase.SERIALIZE], label="serialize"),
        Patch(color=PHASE_COLOURS[Phase.LOCAL_WRITE], label="local write"),
        Patch(color=PHASE_COLOURS[Phase.UPLOAD], label="upload"),
        Patch(color=PHASE_COLOURS[Phase.RANK_INDEX], label="index / commit"),
        Line2D([], [], marker="D", color="#2e8b57", linestyle="none", label="committed"),
        Line2D([], [], marker="X", color="#b22222", linestyle="none", label="skipped / failed"),
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=6, fontsize=7.5, frameon=False, bbox_to_anchor=(0.5, 0.0)
    )
