"""The auxiliary "coherence" loss of the project's brief, with the brief's defects removed.

Four terms are added to cross-entropy with the published weights (stability 0.2, center 0.1,
separation 0.05, Brier 0.1; class centroids are an EMA of momentum 0.97):

- **stability**: mean squared difference between the logits of the clean input and of the same
  input with Gaussian noise on its token embeddings. Both forwards run under the *same dropout
  mask*: the generators' state is saved before the clean forward and restored before the noisy
  one (the noise itself comes from a generator of its own, so it does not shift the masks). We
  replay the mask rather than turn dropout off, because turning it off would either change the
  cross-entropy forward (clean pass in eval mode) or compare a dropout pass against a
  deterministic one, where the dropout noise, not the embedding noise, dominates the difference
  (the brief's ~10⁵ swamping). Zero when the logits ignore the noise.
- **center**: mean squared distance (per feature dimension) between each pooled feature and the
  EMA centroid of its class. The centroids are buffers (no gradient); the features carry it.
  Zero when every feature sits on its class centroid.
- **separation**: ``exp(-||μ_j - μ_k||² / D)`` averaged over ordered pairs j ≠ k of the classes
  present in the batch, where μ are the batch's class means of the pooled features (they carry
  gradient; the brief's EMA centroids did not) and D the feature width. Off-diagonal only: the
  brief summed the diagonal too, a constant ``C·(e⁰)`` offset that no training can remove.
  Near 0 for well-separated classes, 1 when all class means coincide; 0 with fewer than two
  classes in the batch (nothing to separate).
- **Brier**: ``Σ_k (p_k − y_k)²`` on the softmax probabilities (not on logits), averaged over
  samples: 0 for confident right answers, 2 for confident wrong ones.

The pooled feature is the classifier's input: the final-normed hidden state at the last
non-padding token (see :mod:`~vramkit.tasks.text_classification.pooled_features`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from vramkit.core.config.settings import Settings
from vramkit.tasks.text_classification.calibration import brier_score

TERMS = ("stability", "center", "separation", "brier")


class CoherenceSettings(Settings):
    """``model.coherence``: the weight of each term (0 removes it) and the centroid momentum."""

    stability: float = Field(0.2, ge=0)
    """Weight of the clean-vs-noisy logit MSE (published 0.2)."""
    center: float = Field(0.1, ge=0)
    """Weight of the feature-to-class-centroid MSE (published 0.1)."""
    separation: float = Field(0.05, ge=0)
    """Weight of the class-mean separation penalty (published 0.05)."""
    brier: float = Field(0.1, ge=0)
    """Weight of the Brier score of the softmax probabilities (published 0.1)."""
    centroid_momentum: float = Field(0.97, ge=0, lt=1)
    """EMA momentum of the class centroids: c ← m·c + (1 − m)·batch class mean."""
    noise_std: float = Field(0.1, gt=0)
    """Std of the stability term's Gaussian embedding noise, as a fraction of the embeddings'
    root-mean-square."""

    def weights(self) -> dict[str, float]:
        """The weight of each term by name, in :data:`TERMS` order."""
        return {name: getattr(self, name) for name in TERMS}


def stability_term(clean_logits: torch.Tensor, noisy_logits: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of two (B, C) logit tensors (logit units squared)."""
    return F.mse_loss(noisy_logits.float(), clean_logits.float())


def center_term(
    features: torch.Tensor, labels: torch.Tensor, centroids: torch.Tensor
) -> torch.Tensor:
    """Mean over samples and dimensions of (feature − centroid of its class)², for (B, D)
    features, (B,) labels and (C, D) centroids."""
    return (features.float() - centroids[labels].float()).pow(2).mean()


def class_means(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (C, D) mean feature of each class in the batch, and the (C,) bool of those present
    (absent classes get zeros)."""
    one_hot = F.one_hot(labels, num_classes).to(features.dtype)  # (B, C)
    counts = one_hot.sum(dim=0)
    means = one_hot.T @ features / counts.clamp(min=1).unsqueeze(1)
    return means, counts > 0


def separation_term(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Mean of ``exp(-||μ_j − μ_k||² / D)`` over ordered pairs j ≠ k of the classes present in
    the batch (μ: batch class means of the (B, D) features); 0 with fewer than two classes."""
    means, present = class_means(features.float(), labels, num_classes)
    # Pairs are weighted, not selected: a boolean selection has a data-dependent size, which
    # the memory planner's fake tensors cannot trace.
    pairs = present.unsqueeze(0) & present.unsqueeze(1)
    pairs &= ~torch.eye(num_classes, dtype=torch.bool, device=means.device)
    weight = pairs.to(means.dtype)
    squared = (means.unsqueeze(0) - means.unsqueeze(1)).pow(2).sum(dim=-1) / means.shape[1]
    return (torch.exp(-squared) * weight).sum() / weight.sum().clamp(min=1)


class CoherenceLoss(nn.Module):
    """The weighted sum of the four terms, and the class centroids it keeps (buffers, saved in
    checkpoints so a resumed run continues the same EMA)."""

    def __init__(self, settings: CoherenceSettings, *, num_classes: int, feature_dim: int) -> None:
        super().__init__()
        self.settings = settings
        self.num_classes = num_classes
        self.register_buffer("centroids", torch.zeros(num_classes, feature_dim))
        self.register_buffer("centroid_seen", torch.zeros(num_classes, dtype=torch.bool))

    @torch.no_grad()
    def update_centroids(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """EMA update with this batch's class means; a class seen for the first time starts at
        its batch mean (not at the zero vector)."""
        means, present = class_means(features.detach().float(), labels, self.num_classes)
        momentum = self.settings.centroid_momentum
        blended = momentum * self.centroids + (1 - momentum) * means.to(self.centroids.dtype)
        fresh = present & ~self.centroid_seen
        updated = torch.where(fresh.unsqueeze(1), means.to(self.centroids.dtype), blended)
        self.centroids.copy_(torch.where(present.unsqueeze(1), updated, self.centroids))
        self.centroid_seen |= present

    def forward(
        self,
        logits: torch.Tensor,
        features: torch.Tensor,
        labels: torch.Tensor,
        noisy_logits: Callable[[], torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The unweighted value of every term in use and their weighted ``total``.

        ``logits`` (B, C) and ``features`` (B, D) come from the clean forward; ``noisy_logits``
        runs the noisy forward under the clean one's dropout mask (called only when the
        stability weight is not 0). Centroids are updated before the center term is computed,
        so the first batch of a class has a defined target.
        """
        weights = self.settings.weights()
        terms: dict[str, torch.Tensor] = {}
        if weights["stability"] > 0:
            if noisy_logits is None:
                raise ValueError("the stability term needs the noisy forward (noisy_logits)")
            terms["stability"] = stability_term(logits, noisy_logits())
        if weights["center"] > 0:
            if self.training:
                self.update_centroids(features, labels)
            terms["center"] = center_term(features, labels, self.centroids)
        if weights["separation"] > 0:
            terms["separation"] = separation_term(features, labels, self.num_classes)
        if weights["brier"] > 0:
            terms["brier"] = brier_score(torch.softmax(logits.float(), dim=-1), labels)
        total = logits.float().sum() * 0.0
        for name, value in terms.items():
            total = total + weights[name] * value
        return {**terms, "total": total}
