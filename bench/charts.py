"""PNG charts of a benchmark run (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.measure import CHECKPOINTS, CODECS, LAYOUTS, RAW, Figure, Section
from bench.runner import BenchResult

__all__ = ["draw"]

_SUBJECT, _BASELINE = "#2b6cb0", "#a0aec0"
_MET, _MISSED = "#2f855a", "#dd6b20"


def draw(result: BenchResult, directory: Path) -> dict[Section, Path] | None:
    """Write one chart per section into ``directory``; ``None`` (and nothing
    written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    charts = {
        LAYOUTS: (_layouts, "bench-layouts.png"),
        RAW: (_raw, "bench-statetable-vs-raw.png"),
        CODECS: (_codecs, "bench-encoding.png"),
        CHECKPOINTS: (_checkpoints, "bench-checkpoints.png"),
    }
    written = {}
    for section, (plot, filename) in charts.items():
        figures = [f for f in result.figures if f.section is section]
        if not figures:
            continue
        fig = plot(plt, figures)
        fig.text(
            0.99,
            0.01,
            f"{result.config.rows:,} rows · relstate bench",
            ha="right",
            va="bottom",
            fontsize=7,
            color="gray",
        )
        path = directory / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written[section] = path
    return written


def _layouts(plt: Any, figures: list[Figure]) -> Any:
    workloads = list(dict.fromkeys(f.workload for f in figures))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.8))
    if len(workloads) == 1:
        axes = [axes]
    for ax, workload in zip(axes, workloads, strict=True):
        group = [f for f in figures if f.workload == workload]
        xs = range(len(group))
        width = 0.38
        ax.bar(
            [x - width / 2 for x in xs],
            [f.subject * 1e6 for f in group],
            width,
            color=_SUBJECT,
            label=LAYOUTS.subject,
        )
        ax.bar(
            [x + width / 2 for x in xs],
            [f.baseline * 1e6 for f in group],
            width,
            color=_BASELINE,
            label=LAYOUTS.baseline,
        )
        for x, f in zip(xs, group, strict=True):
            ax.annotate(
                f"x{f.ratio:.1f}",
                (x + width / 2, f.baseline * 1e6),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(list(xs), [f.detail for f in group])
        ax.set_title(workload)
        ax.set_ylabel(f"µs per {group[0].unit}")
        ax.margins(y=0.15)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].legend(frameon=False)
    fig.suptitle("Row layout vs cell layout (lower is faster; x: cell time / row time)")
    fig.tight_layout()
    return fig


def _raw(plt: Any, figures: list[Figure]) -> Any:
    return _ratios(
        plt,
        figures,
        RAW,
        "raw rocksdict time / StateTable time (higher is better; 1 = as fast as raw)",
        "StateTable vs raw rocksdict",
    )


def _checkpoints(plt: Any, figures: list[Figure]) -> Any:
    return _ratios(
        plt,
        figures,
        CHECKPOINTS,
        "large-state / small-state commit time (lower is better)",
        "Checkpoint commit: large vs small state",
    )


def _ratios(plt: Any, figures: list[Figure], section: Section, xlabel: str, title: str) -> Any:
    """One bar per figure, its ratio, coloured by whether it meets the section's goal."""
    goal = section.goal or 0.0
    labels = [f.name for f in figures]
    ratios = [f.ratio for f in figures]
    fig, ax = plt.subplots(figsize=(8.5, 0.42 * len(figures) + 1.4))
    ys = range(len(figures))
    colors = [_MET if f.goal_met else _MISSED for f in figures]
    ax.barh(list(ys), ratios, color=colors)
    for y, ratio in zip(ys, ratios, strict=True):
        # Inside the bar's end, clear of the goal line.
        ax.annotate(
            f"{ratio:.2f}",
            (ratio, y),
            xytext=(-4, 0),
            textcoords="offset points",
            ha="right",
            va="center",
            fontsize=8,
            color="white",
            fontweight="bold",
        )
    ax.axvline(goal, color="black", linestyle="--", linewidth=1)
    ax.annotate(
        f"goal {'≤' if section.ceiling else '≥'} {goal:.2f}",
        (goal, 0.0),
        xycoords=("data", "axes fraction"),
        xytext=(3, 3),
        textcoords="offset points",
        va="bottom",
        fontsize=8,
    )
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1.0, goal * 1.2, max(ratios) * 1.15))
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def _codecs(plt: Any, figures: list[Figure]) -> Any:
    fig, ax = plt.subplots(figsize=(8, 0.7 * len(figures) + 1.4))
    ys = range(len(figures))
    height = 0.38
    ax.barh(
        [y - height / 2 for y in ys],
        [1 / f.subject for f in figures],
        height,
        color=_SUBJECT,
        label=CODECS.subject,
    )
    ax.barh(
        [y + height / 2 for y in ys],
        [1 / f.baseline for f in figures],
        height,
        color=_BASELINE,
        label=CODECS.baseline,
    )
    for y, f in zip(ys, figures, strict=True):
        ax.annotate(
            f"x{f.ratio:.1f}",
            (1 / f.subject, y - height / 2),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.xaxis.set_major_formatter(lambda value, _: f"{value / 1e6:g}M" if value else "0")
    ax.set_yticks(list(ys), [f.name for f in figures])
    ax.invert_yaxis()
    ax.set_xlabel("rows per second (higher is faster)")
    ax.set_title("Encoding: RecordBatch at a time vs row at a time (x: speed-up)")
    ax.legend(frameon=False, loc="lower right")
    ax.margins(x=0.1)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
