"""ARC scores that cannot be inflated by padding: cell accuracy, exact match, size accuracy.

- ``cell_acc``: correct cells / cells of the answer. A cell counts only when the predicted grid
  (cropped to its predicted size) has it and gives it the right colour; padding is never a cell.
- ``exact_match``: share of examples whose predicted grid equals the answer, size included.
- ``size_acc``: share of examples whose predicted height and width are right.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vramkit.tasks.sage.grid_outputs import GridPrediction
from vramkit.tasks.sage.grid_tokens import PAD

# order of the counts in a score vector
_CORRECT, _CELLS, _EXACT, _SIZE, _EXAMPLES = range(5)


def score_counts(
    prediction: GridPrediction, target: torch.Tensor, target_size: torch.Tensor
) -> torch.Tensor:
    """(5,) float64 sums for a batch: correct cells, answer cells, exact grids, right sizes,
    examples. ``target`` (B, 30, 30) holds ``PAD`` outside the answer."""
    is_cell = target != PAD
    correct = (prediction.cells == target) & is_cell
    right_size = (prediction.size == target_size).all(dim=1)
    exact = right_size & (correct.sum((1, 2)) == is_cell.sum((1, 2)))
    return torch.stack(
        (
            correct.sum(),
            is_cell.sum(),
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
    ) -> None:
        counts = score_counts(prediction, target, target_size)
        self._counts[name] = self._counts.get(name, torch.zeros_like(counts)) + counts

    def names(self) -> list[str]:
        return sorted(self._counts)

    def results(
        self, reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    ) -> dict[str, dict[str, float]]:
        """``{name: {cell_acc, exact_match, size_acc, examples}}``; ``reduce_sum`` sums the
        count vectors over processes first."""
        results = {}
        for name, counts in sorted(self._counts.items()):
            total = reduce_sum(counts).tolist()
            examples = max(total[_EXAMPLES], 1.0)
            results[name] = {
                "cell_acc": total[_CORRECT] / max(total[_CELLS], 1.0),
                "exact_match": total[_EXACT] / examples,
                "size_acc": total[_SIZE] / examples,
                "examples": total[_EXAMPLES],
            }
        return results
