"""memory_plan.png reads at a glance: the legend inside the axes, a scale that shows the bars."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from vramkit.core.report.memory_plan_figure import memory_plan_figure

MEASURED = {"train": 1.21, "val": 0.64}
PREDICTED = {"train": 1.15, "val": 0.70}


def _drawn(budget_gib: float | None):
    figure = memory_plan_figure(
        MEASURED, PREDICTED, budget_gib, unit_label="peak (host RSS, main process)"
    )
    FigureCanvasAgg(figure).draw()  # legend and text extents exist once drawn
    return figure, figure.axes[0]


@pytest.mark.parametrize("budget_gib", [1.6, 19.2, None])
def test_the_legend_lies_inside_the_axes(budget_gib):
    figure, axes = _drawn(budget_gib)
    renderer = figure.canvas.get_renderer()
    legend = axes.get_legend().get_window_extent(renderer)
    box = axes.get_window_extent(renderer)
    assert box.x0 <= legend.x0 and legend.x1 <= box.x1
    assert box.y0 <= legend.y0 and legend.y1 <= box.y1


def test_a_budget_far_above_the_bars_is_a_note_and_the_bars_fill_the_scale():
    _, axes = _drawn(19.2)
    top = axes.get_ylim()[1]
    assert top < 2 * max(MEASURED.values()), "the bars use most of the axis"
    assert not axes.get_lines(), "no budget line at the top of a flattened scale"
    assert any("budget 19.20 GiB" in text.get_text() for text in axes.texts)


def test_a_budget_near_the_bars_is_a_line_on_the_scale():
    _, axes = _drawn(1.6)
    (line,) = axes.get_lines()
    assert line.get_ydata()[0] == 1.6 and axes.get_ylim()[1] > 1.6
    assert not [t for t in axes.texts if "budget" in t.get_text()]
