"""Losses of grid networks: cell cross-entropy (padding ignored), size cross-entropy, and the
feature distillation terms (masked MSE and cosine) of the SAGE student."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from vramkit.tasks.sage.grids.grid_outputs import GridOutput
from vramkit.tasks.sage.grids.grid_tokens import GRID_SIDE, NUM_COLOURS, PAD


def cell_cross_entropy(
    cell_logits: torch.Tensor,
    target: torch.Tensor,
    query_grid: torch.Tensor | None = None,
    changed_weight: float = 1.0,
) -> torch.Tensor:
    """Mean cross-entropy over the answer's cells; ``PAD`` cells (outside the answer) are ignored.

    ``cell_logits`` (B, 30, 30, 10), ``target`` and ``query_grid`` (B, 30, 30) long with ``PAD``
    outside the grid. A *changed* cell (its answer colour differs from the query input there)
    counts ``changed_weight`` times; the sum is still divided by the number of answer cells.
    """
    flat_target = target.reshape(-1)
    per_cell = F.cross_entropy(
        cell_logits.reshape(-1, NUM_COLOURS).float(),
        flat_target,
        ignore_index=PAD,
        reduction="none",
    )
    if changed_weight != 1.0:
        if query_grid is None:
            raise ValueError("a changed-cell weight needs the query grid")
        changed = (target != query_grid).reshape(-1)
        per_cell = per_cell * torch.where(changed, changed_weight, 1.0)
    return per_cell.sum() / (flat_target != PAD).sum().clamp(min=1)


def size_cross_entropy(size_logits: torch.Tensor, target_size: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the height and width heads; ``size_logits`` (B, 2, 30)."""
    return F.cross_entropy(size_logits.reshape(-1, GRID_SIDE).float(), target_size.reshape(-1) - 1)


def task_loss(
    output: GridOutput,
    batch: Mapping[str, torch.Tensor],
    *,
    size_weight: float,
    changed_weight: float = 1.0,
) -> dict[str, torch.Tensor]:
    """``loss = cell_ce + size_weight × size_ce`` (no size term for a network without a head);
    ``cell_ce`` weighs changed cells ``changed_weight`` times (:func:`cell_cross_entropy`)."""
    cell_ce = cell_cross_entropy(
        output.cell_logits, batch["target"], batch["query_grid"], changed_weight
    )
    losses = {"cell_ce": cell_ce, "loss": cell_ce}
    if output.size_logits is not None:
        size_ce = size_cross_entropy(output.size_logits, batch["target_size"])
        losses["size_ce"] = size_ce
        losses["loss"] = cell_ce + size_weight * size_ce
    return losses


def feature_distillation(
    projected: torch.Tensor, teacher: torch.Tensor, padding_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Masked MSE and cosine distance between projected student states and teacher features.

    Both (B, L, D); positions where ``padding_mask`` (B, L) is True are left out. ``mse`` is the
    mean squared difference per feature, ``cosine`` the mean of 1 − cos over tokens.
    """
    keep = ~padding_mask
    student_tokens = projected[keep].float()
    teacher_tokens = teacher[keep].float()
    mse = F.mse_loss(student_tokens, teacher_tokens)
    cosine = (1.0 - F.cosine_similarity(student_tokens, teacher_tokens, dim=-1)).mean()
    return {"mse": mse, "cosine": cosine}


@dataclass(frozen=True)
class DistillLossWeights:
    """``loss = task × (cell_ce + size × size_ce) + feature × (mse × MSE + cosine × cos)``."""

    task: float = 1.0  # weight of the answer's cross-entropy
    feature: float = 0.5  # weight of the feature distillation
    size: float = 1.0  # weight of the size cross-entropy inside the task loss
    mse: float = 1.0  # weight of the masked MSE inside the feature loss
    cosine: float = 1.0  # weight of the cosine distance inside the feature loss

    def __post_init__(self) -> None:
        for name in ("task", "feature", "size", "mse", "cosine"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.loss.{name} must be >= 0, got {getattr(self, name)}")
