"""Predicted beside expected ARC grids for the run report: best, worst and random queries."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from vramkit.core.report.png import set_title
from vramkit.core.report.task_figures import ReportFigure, image_grid_margins
from vramkit.tasks.sage.grids.grid_outputs import GridOutput, predict_grid
from vramkit.tasks.sage.grids.grid_tokens import PAD

if TYPE_CHECKING:
    import lightning as L
    import torch


class GridPredictor(Protocol):
    """What the figures use of a grid module (GridModelModule is one; it imports this file, so
    this file names what it needs instead of importing it back)."""

    @property
    def device(self) -> torch.device: ...

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any: ...

    def __call__(self, batch: dict[str, torch.Tensor]) -> GridOutput: ...


QUERIES_READ_PER_KIND = 4
"""Validation queries read per one shown: the best and worst are chosen among them."""

# ARC's usual palette (colours 0..9), and white for PAD (outside the grid)
ARC_COLOURS = ListedColormap(
    [
        "#000000", "#0074D9", "#FF4136", "#2ECC40", "#FFDC00",
        "#AAAAAA", "#F012BE", "#FF851B", "#7FDBFF", "#870C25", "#FFFFFF",
    ]
)  # fmt: skip


@dataclass(eq=False)  # compared by identity: it holds arrays
class _Query:
    query: np.ndarray  # (30, 30) input grid, PAD outside
    expected: np.ndarray  # (30, 30) answer, PAD outside
    predicted: np.ndarray  # (30, 30) prediction, PAD outside its predicted size

    @property
    def cell_accuracy(self) -> float:
        """Share of the answer's cells predicted right (a wrong size counts its misses)."""
        inside = self.expected != PAD
        return (
            float((self.predicted[inside] == self.expected[inside]).mean()) if inside.any() else 0.0
        )

    @property
    def exact(self) -> bool:
        return bool(np.array_equal(self.predicted, self.expected))


def grid_figures(module: GridPredictor, trainer: L.Trainer, samples: int) -> list[ReportFigure]:
    """One picture: rows of query / expected / predicted grids for ``samples`` validation queries
    each with the best, the worst and a random cell accuracy (exact matches marked).

    Reads at most ``QUERIES_READ_PER_KIND * 3 * samples`` queries from the start of the
    validation loader.
    """
    datamodule = trainer.datamodule
    if datamodule is None or not hasattr(datamodule, "val_dataloader"):
        return []
    queries = _predict(module, datamodule, QUERIES_READ_PER_KIND * 3 * samples)
    if not queries:
        return []
    ranked = sorted(queries, key=lambda item: item.cell_accuracy)
    per_kind = max(1, min(samples, len(ranked) // 3))
    best = ranked[::-1][:per_kind]
    worst = [item for item in ranked if item not in best][:per_kind]
    rest = [item for item in ranked if item not in best and item not in worst]
    chosen = [
        *(("best", item) for item in best),
        *(("worst", item) for item in worst),
        *(("random", item) for item in random.Random(0).sample(rest, min(per_kind, len(rest)))),
    ]
    return [
        ReportFigure(
            name="grids",
            title="Predicted and expected ARC grids",
            figure=_draw(chosen),
            caption=(
                f"{len(queries)} validation queries read; each row: query input, expected answer, "
                "prediction (white: outside the grid)."
            ),
        )
    ]


def _predict(module: GridPredictor, datamodule: Any, limit: int) -> list[_Query]:
    queries: list[_Query] = []
    for raw in datamodule.val_dataloader():
        batch = datamodule.on_after_batch_transfer(
            module.transfer_batch_to_device(raw, module.device, 0), 0
        )
        prediction = predict_grid(module(batch), batch["query_grid"])
        for query, expected, predicted in zip(
            batch["query_grid"].cpu().numpy(),
            batch["target"].cpu().numpy(),
            prediction.cells.cpu().numpy(),
            strict=True,
        ):
            queries.append(_Query(query, expected, predicted))
            if len(queries) >= limit:
                return queries
    return queries


def _draw(chosen: list[tuple[str, _Query]]) -> Figure:
    size = (7.5, 2.6 * len(chosen))
    figure = Figure(figsize=size)
    axes = figure.subplots(
        len(chosen), 3, squeeze=False, gridspec_kw=image_grid_margins(size, len(chosen), 3)
    )
    for row, (kind, item) in enumerate(chosen):
        side = _extent(item)
        verdict = "exact" if item.exact else f"cells {item.cell_accuracy:.0%}"
        panels = (("query", item.query), ("expected", item.expected), (verdict, item.predicted))
        for column, (label, grid) in enumerate(panels):
            ax = axes[row][column]
            ax.imshow(
                grid[:side, :side], cmap=ARC_COLOURS, vmin=0, vmax=PAD, interpolation="nearest"
            )
            ax.set_xticks([])
            ax.set_yticks([])
            set_title(ax, f"{kind}: {label}" if column == 0 else label, fontsize=9)
    return figure


def _extent(item: _Query) -> int:
    """The side that shows all three grids (they are padded to 30 x 30 at the bottom/right)."""
    inside = [np.argwhere(grid != PAD) for grid in (item.query, item.expected, item.predicted)]
    return max([int(cells.max()) + 1 for cells in inside if cells.size] + [1])
