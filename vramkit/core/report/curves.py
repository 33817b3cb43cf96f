"""Line charts of a run's metrics, drawn with matplotlib's object API (no pyplot global state)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vramkit.core.report.png import save_png, set_title
from vramkit.core.report.run_metrics import Series

PANEL_SIZE_IN = (5.2, 3.2)
"""Width and height of one chart panel (inches)."""
MARGINS_IN = {"left": 0.75, "right": 0.15, "bottom": 0.5, "top": 0.3, "wspace": 0.75, "hspace": 0.8}
"""Fixed room around and between panels (inches): tick labels up to six characters, the axis
label, the title. Fixed instead of ``tight_layout``, which measures every text by drawing the
figure and leaves a layout engine that makes ``savefig`` draw it once more
(matplotlib 3.11 ``backend_bases.FigureCanvasBase.print_figure``): one draw per picture."""

TICK_INTERVALS = 5
"""At most this many intervals between the labelled ticks of an axis (``MaxNLocator(nbins)``;
matplotlib's default fits up to 9-10 on a panel this size). Every tick is five artists (two
marks, two labels, a grid line) made and laid out at each draw: with matplotlib's default,
156k of the report's 871k Python calls (the overhead benchmark's run folder), 46% of a chart's
drawing time under cProfile; six labels read as well as ten."""
TICK_STEPS = (1, 2, 2.5, 5, 10)
"""The tick intervals allowed (times a power of ten): those of matplotlib's default
``AutoLocator`` (matplotlib/ticker.py), so ticks read 0, 500, 1000, never 0, 800, 1600."""


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
    """:func:`series_figure` saved as a PNG at ``path`` (``dpi`` dots per inch)."""
    return save_png(series_figure(panels), path, dpi)


def series_figure(panels: Sequence[Panel]) -> Figure:
    """The panels side by side (three to a row), each :data:`PANEL_SIZE_IN` inches.

    A series logged once per epoch is drawn against the epoch (with markers); one logged every
    step against the optimizer step, so per-step noise and epoch trends each get their own axis.
    """
    columns = min(len(panels), 3)
    rows = (len(panels) + columns - 1) // columns
    size = (PANEL_SIZE_IN[0] * columns, PANEL_SIZE_IN[1] * rows)
    figure = Figure(figsize=size)
    axes = figure.subplots(rows, columns, squeeze=False, gridspec_kw=margins(size, rows, columns))
    for index, panel in enumerate(panels):
        draw_panel(axes[index // columns][index % columns], panel)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    return figure


def margins(
    size_in: tuple[float, float],
    rows: int,
    columns: int,
    room_in: Mapping[str, float] = MARGINS_IN,
) -> dict[str, float]:
    """``room_in`` (inches, :data:`MARGINS_IN`'s keys) as the figure fractions
    ``Figure.subplots(gridspec_kw=...)`` takes, for a figure of ``size_in`` (inches) holding
    ``rows`` x ``columns`` panels."""
    width, height = size_in
    # each axes' own width / height: what is left once the margins and spaces are taken
    panel_width = (
        width - room_in["left"] - room_in["right"] - (columns - 1) * room_in["wspace"]
    ) / columns
    panel_height = (
        height - room_in["bottom"] - room_in["top"] - (rows - 1) * room_in["hspace"]
    ) / rows
    return {
        "left": room_in["left"] / width,
        "right": 1 - room_in["right"] / width,
        "bottom": room_in["bottom"] / height,
        "top": 1 - room_in["top"] / height,
        # gridspec spaces are fractions of one axes' width / height
        "wspace": room_in["wspace"] / panel_width,
        "hspace": room_in["hspace"] / panel_height,
    }


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
    axes.set_xlabel("epoch" if per_epoch else "step")
    # steps and epochs are whole numbers; matplotlib would otherwise label 0.25, 0.5 ...
    axes.xaxis.set_major_locator(MaxNLocator(TICK_INTERVALS, steps=TICK_STEPS, integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(TICK_INTERVALS, steps=TICK_STEPS))
    if panel.from_zero:
        drawn = [entry.values for entry in panel.series]
        drawn += [[value] for name, value in panel.planned.items() if name in _names(panel)]
        tallest = max(max(values) for values in drawn)
        axes.set_ylim(0, max(tallest, 1e-9) * 1.15)
    set_title(axes, panel.title, fontsize=10)  # after the limits, which decide its height
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)


def _names(panel: Panel) -> set[str]:
    return {entry.name for entry in panel.series}
