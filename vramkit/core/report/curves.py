"""Line charts of a run's metrics, drawn with matplotlib's object API (no pyplot global state)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vramkit.core.report.run_metrics import Series

PANEL_SIZE_IN = (5.2, 3.2)
"""Width and height of one chart panel (inches)."""


@dataclass(frozen=True)
class Panel:
    """One chart: its title, the series it draws and how its y axis reads."""

    title: str
    series: Sequence[Series]
    from_zero: bool = False
    """Start the y axis at 0: for amounts (GiB, samples/s, ms), where an axis cut to the data's
    range makes a 2% change fill the panel."""
    planned: Mapping[str, float] = field(default_factory=dict)
    """A planned value per series name, in the series' unit: drawn as a dashed line in that
    series' colour, beside what was measured."""


def plot_series(path: Path, panels: Sequence[Panel], *, dpi: int = 100) -> Path:
    """Draw the panels side by side (three to a row) and save the PNG at ``path``.

    A series logged once per epoch is drawn against the epoch (with markers); one logged every
    step against the optimizer step, so per-step noise and epoch trends each get their own axis.
    """
    columns = min(len(panels), 3)
    rows = (len(panels) + columns - 1) // columns
    figure = Figure(figsize=(PANEL_SIZE_IN[0] * columns, PANEL_SIZE_IN[1] * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, panel in enumerate(panels):
        draw_panel(axes[index // columns][index % columns], panel)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


def draw_panel(axes: Axes, panel: Panel) -> None:
    """Draw `panel` on `axes`: its series, their planned values, its title and axes."""
    per_epoch = all(entry.per_epoch for entry in panel.series)
    for entry in panel.series:
        x = entry.epochs if per_epoch else entry.steps
        marker = "o" if per_epoch or len(entry.values) < 30 else None
        (line,) = axes.plot(
            x, entry.values, marker=marker, markersize=4, linewidth=1.4, label=entry.name
        )
        if entry.name in panel.planned:
            axes.axhline(
                panel.planned[entry.name],
                color=line.get_color(),
                linestyle="--",
                linewidth=1,
                label=f"{entry.name}, planned",
            )
    axes.set_title(panel.title, fontsize=10)
    axes.set_xlabel("epoch" if per_epoch else "step")
    # steps and epochs are whole numbers; matplotlib would otherwise label 0.25, 0.5 ...
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.from_zero:
        drawn = [entry.values for entry in panel.series]
        drawn += [[value] for name, value in panel.planned.items() if name in _names(panel)]
        tallest = max(max(values) for values in drawn)
        axes.set_ylim(0, max(tallest, 1e-9) * 1.15)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)


def _names(panel: Panel) -> set[str]:
    return {entry.name for entry in panel.series}
