"""What grid networks return, and how logits become a predicted grid."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vramkit.tasks.sage.grids.grid_tokens import GRID_SIDE, PAD


@dataclass
class GridOutput:
    """A grid network's forward pass over a batch of B sequences of length L."""

    hidden: torch.Tensor  # (B, L, width) last encoder states, one per input token
    cell_logits: torch.Tensor  # (B, 30, 30, 10) colour logits of every output cell
    size_logits: torch.Tensor | None  # (B, 2, 30) height and width logits (class k = side k+1)


@dataclass
class GridPrediction:
    """Predicted grids: colours inside the predicted size, ``PAD`` outside it."""

    cells: torch.Tensor  # (B, 30, 30) long
    size: torch.Tensor  # (B, 2) long: height, width in cells


def grid_size(grid: torch.Tensor) -> torch.Tensor:
    """(B, 2) height and width of (B, 30, 30) grids padded with ``PAD`` at the bottom/right."""
    inside = grid != PAD
    return torch.stack((inside[:, :, 0].sum(1), inside[:, 0, :].sum(1)), dim=1)


def crop_to_size(cells: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """(B, 30, 30) colours with every cell outside the (B, 2) size set to ``PAD``."""
    side = torch.arange(GRID_SIDE, device=cells.device)
    inside = (side[None, :, None] < size[:, 0, None, None]) & (
        side[None, None, :] < size[:, 1, None, None]
    )
    return torch.where(inside, cells, torch.full_like(cells, PAD))


def predict_grid(output: GridOutput, query_grid: torch.Tensor) -> GridPrediction:
    """The most likely colour of every cell, cropped to the most likely size.

    A network without a size head (``size_logits`` None) is taken to answer at the size of the
    query input grid.
    """
    if output.size_logits is None:
        size = grid_size(query_grid)
    else:
        size = output.size_logits.argmax(-1) + 1
    return GridPrediction(cells=crop_to_size(output.cell_logits.argmax(-1), size), size=size)


def copy_prediction(query_grid: torch.Tensor) -> GridPrediction:
    """The baseline that answers every query with its own input grid."""
    return GridPrediction(cells=query_grid, size=grid_size(query_grid))
