"""The report's memory picture: each phase's measured peak beside the planner's prediction.

Drawn to be read at a glance: the legend inside the axes, and a scale that shows the bars. A
budget far above the bars (a 1.2 GiB run on a 19 GiB budget) would flatten them against the
floor if the axis reached it: the budget is then named in a note inside the axes instead of
drawn as a line.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from vramkit.core.report.curves import PANEL_SIZE_IN, margins
from vramkit.core.report.png import save_png, set_title

BUDGET_ON_SCALE = 2.0
"""The budget is drawn as a line when it is at most this many times the tallest bar."""
HEADROOM = 1.45
"""The axis top over the tallest thing drawn: room for the bar labels and the legend."""


def memory_plan_figure(
    measured_gib: dict[str, float],
    predicted_gib: dict[str, float],
    budget_gib: float | None,
    *,
    unit_label: str,
    predicted_label: str = "planner's prediction",
) -> Figure:
    """Bars of each phase's measured peak (GiB) beside the planner's prediction, and the budget
    (a dashed line when it is on the bars' scale, else a note)."""
    phases = sorted(set(measured_gib) | set(predicted_gib), key=_phase_order)
    figure = Figure(figsize=PANEL_SIZE_IN)
    # fixed margins, not tight_layout: one draw per picture (see curves.MARGINS_IN)
    axes = figure.subplots(gridspec_kw=margins(PANEL_SIZE_IN, 1, 1))
    width = 0.38
    positions = range(len(phases))
    bars = [
        ("measured " + unit_label, measured_gib, -width / 2, "tab:blue"),
        (predicted_label, predicted_gib, width / 2, "tab:orange"),
    ]
    for label, values, offset, colour in bars:
        if not values:
            continue
        heights = [values.get(phase, 0.0) for phase in phases]
        drawn = axes.bar([p + offset for p in positions], heights, width, label=label, color=colour)
        axes.bar_label(drawn, fmt="%.2f", fontsize=8)
    tallest = max([*measured_gib.values(), *predicted_gib.values(), 1e-3])
    if budget_gib is not None and budget_gib <= BUDGET_ON_SCALE * tallest:
        axes.axhline(budget_gib, color="tab:red", linestyle="--", linewidth=1, label="budget")
        tallest = max(tallest, budget_gib)
    elif budget_gib is not None:
        axes.text(
            0.98,
            0.97,
            f"budget {budget_gib:.2f} GiB\n(above this scale)",
            transform=axes.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="tab:red",
        )
    axes.set_xticks(list(positions), phases)
    axes.set_ylabel("GiB")
    axes.set_ylim(0, tallest * HEADROOM)
    set_title(axes, "peak memory per phase", fontsize=10)
    axes.legend(fontsize=8, loc="upper left", ncols=1, framealpha=0.9)
    return figure


def plot_memory_plan(
    path: Path,
    measured_gib: dict[str, float],
    predicted_gib: dict[str, float],
    budget_gib: float | None,
    *,
    unit_label: str,
    predicted_label: str = "planner's prediction",
    dpi: int = 100,
) -> Path:
    """:func:`memory_plan_figure` saved as a PNG at `path` (`dpi` dots per inch)."""
    figure = memory_plan_figure(
        measured_gib,
        predicted_gib,
        budget_gib,
        unit_label=unit_label,
        predicted_label=predicted_label,
    )
    return save_png(figure, path, dpi)


def _phase_order(phase: str) -> tuple[int, str]:
    order = {"train": 0, "val": 1, "test": 2}
    return order.get(phase, 3), phase
