"""DBNet's head: probability and threshold maps, and differentiable binarisation."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _upsampling_branch(in_channels: int) -> nn.Sequential:
    """3x3 conv-BN-ReLU, ConvTranspose(2,2)-BN-ReLU, ConvTranspose(2,2) to one channel: x4 size."""
    mid = in_channels // 4
    return nn.Sequential(
        nn.Conv2d(in_channels, mid, 3, padding=1, bias=False),
        nn.BatchNorm2d(mid),
        nn.ReLU(inplace=True),
        nn.ConvTranspose2d(mid, mid, 2, stride=2),
        nn.BatchNorm2d(mid),
        nn.ReLU(inplace=True),
        nn.ConvTranspose2d(mid, 1, 2, stride=2),
    )


def differentiable_binarisation(prob_logits: Tensor, thresh: Tensor, k: float) -> Tensor:
    """Logits of DBNet's approximate step function: ``k * (sigmoid(prob_logits) - thresh)``.

    ``sigmoid`` of the result is ``1 / (1 + exp(-k (P - T)))`` of the paper; keeping it as logits
    lets the loss apply its own sigmoid in float32.
    """
    return k * (torch.sigmoid(prob_logits) - thresh)


class DBHead(nn.Module):
    """Two branches over the stride-4 neck output, each producing a full-resolution map.

    The probability branch returns logits; the threshold branch returns values in (0, 1).
    """

    def __init__(self, in_channels: int, k: float = 50.0) -> None:
        super().__init__()
        if in_channels < 4 or in_channels % 4:
            raise ValueError(f"in_channels must be a positive multiple of 4, got {in_channels}")
        if not k > 0:
            raise ValueError(f"binarisation steepness k must be > 0, got {k}")
        self.k = float(k)
        self.prob = _upsampling_branch(in_channels)
        self.thresh = _upsampling_branch(in_channels)

    def init_output_layers(self, prob_prior: float = 0.01) -> None:
        """Start from near-constant maps: probability ``prob_prior`` everywhere, threshold 0.5.

        Text covers a small fraction of an image, so starting the probability at a small prior
        (as RetinaNet does) avoids a first phase spent unlearning 0.5 on the background.
        """
        if not 0.0 < prob_prior < 1.0:
            raise ValueError(f"prob_prior must lie in (0, 1), got {prob_prior}")
        for branch, bias in (
            (self.prob, math.log(prob_prior / (1.0 - prob_prior))),
            (self.thresh, 0.0),
        ):
            last = branch[-1]
            nn.init.normal_(last.weight, std=0.01)
            nn.init.constant_(last.bias, bias)

    def forward(self, features: Tensor, *, with_threshold: bool = True) -> dict[str, Tensor]:
        """Map neck features (B, C, h, w) to maps of shape (B, 4h, 4w).

        Returns ``prob_logits``; with ``with_threshold`` also ``thresh`` and ``binary_logits``.
        """
        prob_logits = self.prob(features).squeeze(1)
        outputs = {"prob_logits": prob_logits}
        if with_threshold:
            thresh = torch.sigmoid(self.thresh(features).squeeze(1))
            outputs["thresh"] = thresh
            outputs["binary_logits"] = differentiable_binarisation(prob_logits, thresh, self.k)
        return outputs
