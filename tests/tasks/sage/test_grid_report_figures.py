"""SAGE draws query, expected and predicted grids for the run report."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import numpy as np
import torch
from test_grid_module_oom import _batch, _student, _teacher

from vramkit.core.report.task_figures import DrawsReportFigures
from vramkit.tasks.sage.grids.grid_tokens import PAD
from vramkit.tasks.sage.report_figures import ARC_COLOURS, _Query


class _Batches(L.LightningDataModule):
    def __init__(self, features: bool = False) -> None:
        super().__init__()
        self.features = features

    def val_dataloader(self):
        return [_batch(seed, features=self.features) for seed in range(3)]


def test_grid_module_draws_best_worst_and_random_queries():
    module = _teacher()
    assert isinstance(module, DrawsReportFigures)
    module.eval()
    with torch.no_grad():
        figures = module.report_figures(SimpleNamespace(datamodule=_Batches()), samples=2)
    assert [figure.name for figure in figures] == ["grids"]
    axes = figures[0].figure.axes
    titles = [ax.get_title() for ax in axes]
    # 12 queries read: 2 best, 2 worst, 2 random rows of query / expected / prediction
    assert len(axes) == 6 * 3
    assert [t.split(":")[0] for t in titles[::3]] == ["best"] * 2 + ["worst"] * 2 + ["random"] * 2
    assert "12 validation queries" in figures[0].caption


def test_cell_accuracy_counts_only_the_answer_cells():
    expected = np.full((30, 30), PAD, dtype=np.uint8)
    expected[:2, :2] = [[1, 2], [3, 4]]
    predicted = expected.copy()
    predicted[0, 0] = 5
    predicted[5, 5] = 7  # outside the answer: a wrong size, not a wrong cell
    query = _Query(expected, expected, predicted)
    assert query.cell_accuracy == 0.75
    assert not query.exact
    assert ARC_COLOURS.N == PAD + 1  # one colour per ARC colour, and white for PAD


def test_the_distilled_student_draws_its_grids_too():
    module = _student()
    module.eval()
    with torch.no_grad():
        (figure,) = module.report_figures(SimpleNamespace(datamodule=_Batches(True)), samples=1)
    assert len(figure.figure.axes) == 3 * 3
