"""Calibration metrics of a classifier over a whole validation epoch: ECE and the Brier score.

ECE is torchmetrics' ``MulticlassCalibrationError`` (top-1 confidence, 15 equal-width bins over
[0, 1], L1 norm: Σ_bins |accuracy − confidence| · share of samples, Guo et al. 2017). The Brier
score is Brier's (1950) multiclass form, ``Σ_k (p_k − y_k)²`` per sample (0 to 2), averaged
over samples; torchmetrics has no multiclass Brier score, so :class:`MulticlassBrierScore` sums
it over the epoch (and across processes) the same way.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torchmetrics import Metric
from torchmetrics.classification import MulticlassCalibrationError

ECE_BINS = 15  # equal-width confidence bins, as in Guo et al. (2017)


def brier_score(probabilities: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over samples of ``Σ_k (p_k − onehot(y)_k)²`` for (B, C) probabilities and (B,)
    labels; 0 (right and certain) to 2 (wrong and certain)."""
    target = F.one_hot(labels, probabilities.shape[-1]).to(probabilities.dtype)
    return (probabilities - target).pow(2).sum(dim=-1).mean()


class MulticlassBrierScore(Metric):
    """The Brier score of every sample seen since the last reset (see :func:`brier_score`)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state(
            "total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, probabilities: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch of (B, C) probabilities and (B,) labels."""
        target = F.one_hot(labels, probabilities.shape[-1]).to(probabilities.dtype)
        self.total += (probabilities - target).pow(2).sum().double()
        self.count += labels.numel()

    def compute(self) -> torch.Tensor:
        """The mean score (0 to 2)."""
        return (self.total / self.count.clamp(min=1)).float()


def expected_calibration_error(num_classes: int) -> MulticlassCalibrationError:
    """Top-1 ECE with :data:`ECE_BINS` equal-width bins (L1), accumulated until reset."""
    return MulticlassCalibrationError(num_classes=num_classes, n_bins=ECE_BINS, norm="l1")
