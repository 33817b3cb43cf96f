"""Padding is ignored by the loss and never a correct cell; exact match needs the right size;
copying the input scores 0 on the changed cells."""

from __future__ import annotations

import torch

from vramkit.tasks.sage.grids.grid_loss import (
    cell_cross_entropy,
    feature_distillation,
    size_cross_entropy,
)
from vramkit.tasks.sage.grids.grid_metrics import GridScoreboard, score_counts
from vramkit.tasks.sage.grids.grid_outputs import GridPrediction, crop_to_size, grid_size
from vramkit.tasks.sage.grids.grid_tokens import PAD


def _target(height: int, width: int, colour: int = 0) -> torch.Tensor:
    target = torch.full((1, 30, 30), PAD)
    target[0, :height, :width] = colour
    return target


def test_cell_loss_ignores_padding_cells():
    target = _target(2, 3)
    logits = torch.randn(1, 30, 30, 10)
    changed = logits.clone()
    changed[0, 2:, :, :] = torch.randn(28, 30, 10) * 50  # only padded cells change
    changed[0, :, 3:, :] = torch.randn(30, 27, 10) * 50
    assert torch.allclose(cell_cross_entropy(logits, target), cell_cross_entropy(changed, target))
    perfect = torch.full((1, 30, 30, 10), -20.0)
    perfect[..., 0] = 20.0  # colour 0 everywhere: right on the 6 cells, whatever on the pad
    assert cell_cross_entropy(perfect, target) < 1e-6


def test_padding_is_never_a_correct_cell():
    target = _target(2, 2, colour=0)
    # predicting PAD everywhere "matches" the 896 padded cells but scores nothing
    all_pad = GridPrediction(cells=torch.full((1, 30, 30), PAD), size=torch.tensor([[2, 2]]))
    counts = score_counts(all_pad, target, torch.tensor([[2, 2]]), _target(2, 2, colour=1))
    assert counts[:4].tolist() == [0.0, 4.0, 0.0, 4.0]
    # colour 0 (the background) inside the grid is a real cell
    zeros = GridPrediction(
        cells=crop_to_size(torch.zeros(1, 30, 30, dtype=torch.long), torch.tensor([[2, 2]])),
        size=torch.tensor([[2, 2]]),
    )
    counts = score_counts(zeros, target, torch.tensor([[2, 2]]), _target(2, 2, colour=1))
    assert counts[[0, 1, 4]].tolist() == [4.0, 4.0, 1.0]


def test_exact_match_needs_the_right_size_and_every_cell():
    target = _target(2, 2, colour=3)
    size = torch.tensor([[2, 2]])
    too_big = GridPrediction(
        cells=crop_to_size(torch.full((1, 30, 30), 3), torch.tensor([[3, 2]])),
        size=torch.tensor([[3, 2]]),
    )
    counts = score_counts(too_big, target, size, _target(2, 2, colour=1))
    assert counts.tolist() == [4.0, 4.0, 4.0, 4.0, 0.0, 0.0, 1.0]  # all cells right, wrong size
    too_small = GridPrediction(
        cells=crop_to_size(torch.full((1, 30, 30), 3), torch.tensor([[1, 2]])),
        size=torch.tensor([[1, 2]]),
    )
    counts = score_counts(too_small, target, size, _target(2, 2, colour=1))
    assert counts[[0, 1, 4]].tolist() == [2.0, 4.0, 0.0]


def test_scoreboard_micro_averages_cells():
    board = GridScoreboard()
    big, small = _target(10, 10, 1), _target(1, 1, 1)
    wrong = GridPrediction(
        cells=crop_to_size(torch.full((1, 30, 30), 2), torch.tensor([[10, 10]])),
        size=torch.tensor([[10, 10]]),
    )
    right = GridPrediction(
        cells=crop_to_size(torch.full((1, 30, 30), 1), torch.tensor([[1, 1]])),
        size=torch.tensor([[1, 1]]),
    )
    board.add("", wrong, big, torch.tensor([[10, 10]]), big)
    board.add("", right, small, torch.tensor([[1, 1]]), _target(1, 1, 0))
    scores = board.results()[""]
    assert scores["cell_acc"] == 1 / 101
    assert scores["changed_cell_acc"] == 1.0  # the one cell that differs from its input
    assert scores["exact_match"] == 0.5 and scores["size_acc"] == 1.0


def test_grid_size_reads_padding():
    assert grid_size(_target(4, 7)).tolist() == [[4, 7]]


def test_size_loss_prefers_the_right_side():
    logits = torch.zeros(1, 2, 30)
    logits[0, 0, 3] = logits[0, 1, 6] = 10.0  # height 4, width 7
    right = size_cross_entropy(logits, torch.tensor([[4, 7]]))
    assert right < size_cross_entropy(logits, torch.tensor([[5, 7]]))


def test_feature_loss_ignores_padding_positions():
    student = torch.randn(2, 5, 8)
    teacher = student.clone()
    mask = torch.tensor([[False, False, False, True, True], [False] * 5])
    teacher[0, 3:] = torch.randn(2, 8) * 100  # differences only at padding
    losses = feature_distillation(student, teacher, mask)
    assert losses["mse"] < 1e-10 and losses["cosine"] < 1e-6
    teacher[1, 0] += 1.0
    assert feature_distillation(student, teacher, mask)["mse"] > 0


def test_copying_the_input_scores_zero_on_changed_cells():
    query = _target(3, 3, colour=0)
    query[0, 1, 1] = 5
    target = _target(3, 4, colour=0)  # one colour changed, one column added
    target[0, 0, 0] = 2
    size = torch.tensor([[3, 4]])
    copy = GridPrediction(cells=query, size=grid_size(query))
    board = GridScoreboard()
    board.add("copy_", copy, target, size, query)
    # fix the changed colour and the centre (5 -> 0) but not the new column
    partly = target.clone()
    partly[0, :, 3] = 7
    board.add("", GridPrediction(cells=partly, size=size), target, size, query)
    results = board.results()
    assert results["copy_"]["cell_acc"] == 7 / 12  # 9 copied cells, 2 of them changed
    assert results["copy_"]["changed_cell_acc"] == 0.0
    # changed: (0, 0), the centre, and the new column's 3 cells; the model has 2 of 5
    assert results[""]["changed_cell_acc"] == 2 / 5


def test_changed_cells_weigh_more_in_the_cell_loss():
    query = _target(1, 2, colour=0)
    target = query.clone()
    target[0, 0, 1] = 4  # one of the 2 cells changes
    logits = torch.zeros(1, 30, 30, 10)  # ln(10) per cell
    base = cell_cross_entropy(logits, target, query)
    weighted = cell_cross_entropy(logits, target, query, changed_weight=3.0)
    assert torch.allclose(base, torch.log(torch.tensor(10.0)))
    assert torch.allclose(weighted, base * (1 + 3) / 2)  # still divided by the 2 cells
