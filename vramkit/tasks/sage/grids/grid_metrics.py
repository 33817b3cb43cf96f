"""ARC scores that cannot be inflated by padding or by copying the input.

- ``cell_acc``: correct cells / cells of the answer. A cell counts only when the predicted grid
  (cropped to its predicted size) has it and gives it the right colour; padding is never a cell.
- ``changed_cell_acc``: the same over the *changed* cells only, those whose answer colour differs
  from the query input at that place (or that lie outside the input grid). Most ARC answers
  repeat much of their input, so copying it scores high on ``cell_acc`` and exactly 0 here: this
  is the share of the work a model actually did.
- ``exact_match``: share of examples whose predicted grid equals the answer, size included.
- ``size_acc``: share of examples whose predicted height and width are right.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vramkit.tasks.sage.grids.grid_outputs import GridPrediction
from vramkit.tasks.sage.grids.grid_tokens import PAD

SCORE_NAMES = ("cell_acc", "changed_cell_acc", "exact_match", "size_acc")  # each predictor's

# order of the counts in a score vector
_CORRECT, _CELLS, _CHANGED_CORRECT, _CHANGED, _EXACT, _SIZE, _EXAMPLES = range(7)


def score_counts(
    prediction: GridPrediction,
    target: torch.Tensor,
    target_size: torch.Tensor,
    query_grid: torch.Tensor,
) -> torch.Tensor:
    """(7,) float64 sums for a batch: correct cells, answer cells, correct changed cells,
    changed cells, exact grids, right sizes, examples. ``target`` and ``query_grid``
    (B, 30, 30) hold ``PAD`` outside the answer and the query input."""
    is_cell = target != PAD
    correct = (prediction.cells == target) & is_cell
    changed = is_cell & (target != query_grid)
    right_size = (prediction.size == target_size).all(dim=1)
    exact = right_size & (correct.sum((1, 2)) == is_cell.sum((1, 2)))
    return torch.stack(
        (
            correct.sum(),
            is_cell.sum(),
            (correct & changed).sum(),
            changed.sum(),
            exact.sum(),
            right_size.sum(),
            torch.tensor(target.shape[0], device=target.device),
        )
    ).double()


class GridScoreboard:
    """Sums :func:`score_counts` per predictor name over an epoch."""

    def __init__(self) -> None:
        self._counts: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        self._counts = {}

    def add(
        self,
        name: str,
        prediction: GridPrediction,
        target: torch.Tensor,
        target_size: torch.Tensor,
        query_grid: torch.Tensor,
    ) -> None:
        counts = score_counts(prediction, target, target_size, query_grid)
        self._counts[name] = self._counts.get(name, torch.zeros_like(counts)) + counts

    def names(self) -> list[str]:
        return sorted(self._counts)

    def results(
        self, reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    ) -> dict[str, dict[str, float]]:
        """``{name: {cell_acc, changed_cell_acc, exact_match, size_acc, examples}}``;
        ``reduce_sum`` sums the count vectors over processes first."""
        results = {}
        for name, counts in sorted(self._counts.items()):
            total = reduce_sum(counts).tolist()
            examples = max(total[_EXAMPLES], 1.0)
            results[name] = {
                "cell_acc": total[_CORRECT] / max(total[_CELLS], 1.0),
                "changed_cell_acc": total[_CHANGED_CORRECT] / max(total[_CHANGED], 1.0),
                "exact_match": total[_EXACT] / examples,
                "size_acc": total[_SIZE] / examples,
                "examples": total[_EXAMPLES],
            }
        return results
