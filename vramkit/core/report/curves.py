"""Line charts of a run's metrics, drawn with matplotlib's object API (no pyplot global state)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vramkit.core.report.run_metrics import Series

PANEL_SIZE_IN = (5.2, 3.2)
"""Width and height of one chart panel (inches)."""


def plot_series(
    path: Path,
    panels: Sequence[tuple[str, Sequence[Series]]],
    *,
    dpi: int = 100,
) -> Path:
    """Draw one panel per ``(title, series)`` pair side by side and save the PNG at ``path``.

    A series logged once per epoch is drawn against the epoch (with markers); one logged every
    step against the optimizer step, so per-step noise and epoch trends each get their own axis.
    """
    columns = min(len(panels), 3)
    rows = (len(panels) + columns - 1) // columns
    figure = Figure(figsize=(PANEL_SIZE_IN[0] * columns, PANEL_SIZE_IN[1] * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, (title, series) in enumerate(panels):
        _draw_panel(axes[index // columns][index % columns], title, series)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


def _draw_panel(axes: Axes, title: str, series: Sequence[Series]) -> None:
    per_epoch = all(entry.per_epoch for entry in series)
    for entry in series:
        x = entry.epochs if per_epoch else entry.steps
        marker = "o" if per_epoch or len(entry.values) < 30 else None
        axes.plot(x, entry.values, marker=marker, markersize=4, linewidth=1.4, label=entry.name)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("epoch" if per_epoch else "step")
    # steps and epochs are whole numbers; matplotlib would otherwise label 0.25, 0.5 ...
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)


def plot_memory_plan(
    path: Path,
    measured_gib: dict[str, float],
    predicted_gib: dict[str, float],
    budget_gib: float | None,
    *,
    unit_label: str,
    dpi: int = 100,
) -> Path:
    """Bars of each phase's measured peak beside the planner's prediction (GiB), with the budget."""
    phases = sorted(set(measured_gib) | set(predicted_gib), key=_phase_order)
    figure = Figure(figsize=PANEL_SIZE_IN)
    axes = figure.subplots()
    width = 0.38
    positions = range(len(phases))
    bars = [
        ("measured " + unit_label, measured_gib, -width / 2, "tab:blue"),
        ("planner's prediction", predicted_gib, width / 2, "tab:orange"),
    ]
    for label, values, offset, colour in bars:
        if not values:
            continue
        heights = [values.get(phase, 0.0) for phase in phases]
        drawn = axes.bar([p + offset for p in positions], heights, width, label=label, color=colour)
        axes.bar_label(drawn, fmt="%.2f", fontsize=8)
    if budget_gib is not None:
        axes.axhline(budget_gib, color="tab:red", linestyle="--", linewidth=1, label="budget")
    axes.set_xticks(list(positions), phases)
    axes.set_ylabel("GiB")
    axes.set_title("peak memory per phase", fontsize=10)
    tallest = max([*measured_gib.values(), *predicted_gib.values(), budget_gib or 0.0, 1e-3])
    axes.set_ylim(0, tallest * 1.35)  # room above the bars for the legend
    axes.legend(fontsize=8, loc="upper left", ncols=3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


def _phase_order(phase: str) -> tuple[int, str]:
    order = {"train": 0, "val": 1, "test": 2}
    return order.get(phase, 3), phase
