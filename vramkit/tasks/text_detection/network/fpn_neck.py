"""DBNet's feature-pyramid neck: fuse C2..C5 into one stride-4 feature map."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class FPNNeck(nn.Module):
    """Top-down feature pyramid as in DBNet (Liao et al., 2020).

    Each input level gets a 1x1 lateral conv to ``inner_channels``; coarser levels are
    nearest-upsampled and added top-down; every level is smoothed by a 3x3 conv to
    ``inner_channels // 4``, upsampled to the stride-4 size, and the four are concatenated
    (coarsest first) into ``inner_channels`` channels at stride 4 px.
    """

    def __init__(self, in_channels: Sequence[int], inner_channels: int = 256) -> None:
        super().__init__()
        if len(in_channels) != 4:
            raise ValueError(f"FPNNeck expects 4 input levels (C2..C5), got {len(in_channels)}")
        if inner_channels < 4 or inner_channels % 4:
            raise ValueError(
                f"inner_channels must be a positive multiple of 4, got {inner_channels}"
            )
        self.inner_channels = inner_channels
        # No bias and no BN here, as in the reference: the head's first conv is followed by BN.
        self.lateral = nn.ModuleList(
            nn.Conv2d(channels, inner_channels, 1, bias=False) for channels in in_channels
        )
        self.smooth = nn.ModuleList(
            nn.Conv2d(inner_channels, inner_channels // 4, 3, padding=1, bias=False)
            for _ in in_channels
        )

    @property
    def out_channels(self) -> int:
        return self.inner_channels

    def forward(self, features: Sequence[Tensor]) -> Tensor:
        """Map ``[C2, C3, C4, C5]`` to a (B, inner_channels, H/4, W/4) tensor."""
        laterals = [conv(feature) for conv, feature in zip(self.lateral, features, strict=True)]
        merged = [laterals[-1]]
        for lateral in reversed(laterals[:-1]):
            coarser = F.interpolate(merged[-1], size=lateral.shape[-2:], mode="nearest")
            merged.append(lateral + coarser)
        merged.reverse()  # back to fine-to-coarse: P2, P3, P4, P5

        target_size = merged[0].shape[-2:]
        smoothed = []
        for conv, level in zip(self.smooth, merged, strict=True):
            out = conv(level)
            if out.shape[-2:] != target_size:
                out = F.interpolate(out, size=target_size, mode="nearest")
            smoothed.append(out)
        return torch.cat(smoothed[::-1], dim=1)
