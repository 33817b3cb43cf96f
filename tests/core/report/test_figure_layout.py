"""The report's charts keep fixed margins: every label inside the picture, no panel over another,
and one draw per saved picture (``tight_layout`` drew each twice more)."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vramkit.core.report.curves import Panel, plot_series, series_figure
from vramkit.core.report.memory_plan_figure import plot_memory_plan
from vramkit.core.report.run_metrics import Series
from vramkit.core.report.task_figures import ReportFigure, image_grid_margins, save_task_figure


def _series(name: str, values: list[float], *, per_step: bool) -> Series:
    steps = list(range(len(values)))
    epochs = [0] * len(values) if per_step else steps
    return Series(name, steps, epochs, values)


# the widest tick labels the report draws: a learning rate (0.00035), a step time (2100 ms)
PANELS = [
    Panel("learning rate", [_series("lr-AdamW", [8e-5, 1.6e-4, 3.2e-4], per_step=True)]),
    Panel("step time (ms)", [_series("perf/train_step_ms_p90", [1320.0, 2100.0], per_step=True)]),
    Panel("validation", [_series("val/hmean", [0.25, 0.75], per_step=False)]),
    Panel("samples/s", [_series("perf/train_samples_per_s", [3.0, 1.9], per_step=True)]),
]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_every_panel_and_its_labels_lie_inside_the_picture_apart(count):
    figure = series_figure(PANELS[:count])
    FigureCanvasAgg(figure).draw()
    renderer = figure.canvas.get_renderer()
    picture = figure.bbox
    boxes = [axes.get_tightbbox(renderer) for axes in figure.axes if axes.get_visible()]
    for box in boxes:
        assert picture.x0 <= box.x0 and box.x1 <= picture.x1
        assert picture.y0 <= box.y0 and box.y1 <= picture.y1
    for index, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[index + 1 :])


def _count_draws(monkeypatch) -> list[int]:
    draws: list[int] = []
    original = Figure.draw

    def counted(self, renderer):
        draws.append(1)
        return original(self, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    return draws


def test_a_chart_is_drawn_once_to_save_it(monkeypatch, tmp_path: Path):
    draws = _count_draws(monkeypatch)
    plot_series(tmp_path / "chart.png", PANELS)
    assert len(draws) == 1


def test_the_memory_picture_is_drawn_once_to_save_it(monkeypatch, tmp_path: Path):
    draws = _count_draws(monkeypatch)
    plot_memory_plan(
        tmp_path / "memory_plan.png", {"train": 1.3}, {"train": 1.4}, 2.5, unit_label="peak"
    )
    assert len(draws) == 1


def test_a_task_picture_is_drawn_once_to_save_it(monkeypatch, tmp_path: Path):
    size = (4.0, 2.0)
    figure = Figure(figsize=size)
    for axes in figure.subplots(1, 2, gridspec_kw=image_grid_margins(size, 1, 2)):
        axes.imshow([[0, 1], [1, 0]])
        axes.set_title("best: img_1\nhmean 0.50", fontsize=8)
    canvas = FigureCanvasAgg(figure)
    draws = _count_draws(monkeypatch)
    save_task_figure(ReportFigure("grid", "A grid", figure), tmp_path)
    assert len(draws) == 1
    renderer = canvas.get_renderer()
    for axes in figure.axes:
        box = axes.get_tightbbox(renderer)
        assert figure.bbox.y1 >= box.y1  # the two-line title inside the picture
