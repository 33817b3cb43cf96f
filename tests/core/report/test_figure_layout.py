"""The report's charts keep fixed margins: every label inside the picture, no panel over another,
and one draw per saved picture (``tight_layout`` drew each twice more)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from matplotlib.axis import YAxis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vramkit.core.report.curves import (
    TICK_INTERVALS,
    TICK_STEPS,
    Panel,
    plot_series,
    series_figure,
)
from vramkit.core.report.memory_plan_figure import plot_memory_plan
from vramkit.core.report.png import save_png
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


def test_saving_a_chart_measures_no_tick_label_for_its_titles(monkeypatch, tmp_path: Path):
    # matplotlib's automatic title placement measures every y tick label once more per title
    # and draw (Axes._update_title_position -> YAxis.get_tightbbox); the report titles at a
    # fixed height instead
    measured: list[int] = []
    original = YAxis.get_tightbbox

    def counted(self, *args, **kwargs):
        measured.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(YAxis, "get_tightbbox", counted)
    plot_series(tmp_path / "chart.png", PANELS)
    plot_memory_plan(
        tmp_path / "memory.png", {"train": 1.3}, {"train": 1.4}, 2.5, unit_label="peak"
    )
    assert measured == []


def test_a_title_clears_the_y_offset_text():
    # values a few parts in a million apart: the y axis labels them as offsets from 1 and
    # prints the offset above its top left, where a title at the fixed height would overlap it
    values = [1.000001, 1.000004, 1.000002]
    title = "resident set at phase end, main process (GiB) (per epoch)"  # the longest title
    figure = series_figure([Panel(title, [_series("mem/train_rss_gib", values, per_step=False)])])
    FigureCanvasAgg(figure).draw()
    renderer = figure.canvas.get_renderer()
    (axes,) = figure.axes
    offset = axes.yaxis.get_offset_text()
    assert offset.get_text()  # the case this test is about
    assert not axes.title.get_window_extent(renderer).overlaps(offset.get_window_extent(renderer))


def test_an_axis_labels_at_most_six_ticks_on_round_steps():
    figure = series_figure(PANELS)
    FigureCanvasAgg(figure).draw()
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            low, high = axis.get_view_interval()
            shown = [tick for tick in axis.get_majorticklocs() if low <= tick <= high]
            assert 2 <= len(shown) <= TICK_INTERVALS + 1
            step = (shown[1] - shown[0]) / 10 ** math.floor(math.log10(shown[1] - shown[0]))
            assert any(math.isclose(step, allowed) for allowed in TICK_STEPS)


@pytest.mark.parametrize("level", [0, 1])
def test_pictures_are_written_with_zlibs_fastest_compression(tmp_path: Path, level):
    figure = series_figure(PANELS[:1])
    path = save_png(figure, tmp_path / "chart.png", dpi=50)
    data = path.read_bytes()
    start = data.index(b"IDAT") + 4  # the zlib stream: CMF, then FLG whose top bits say its level
    assert data[start + 1] >> 6 == 0  # FLEVEL 0: "compressor used fastest algorithm" (RFC 1950)
    if level:  # and matplotlib's own default writes FLEVEL 2 ("default algorithm")
        figure.savefig(tmp_path / "default.png", dpi=50)
        default = (tmp_path / "default.png").read_bytes()
        assert default[default.index(b"IDAT") + 5] >> 6 == 2
