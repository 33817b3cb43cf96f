"""DBNet text detector (Liao et al., AAAI 2020): ResNet-18-style backbone, FPN neck, DB head."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from vramkit.tasks.text_detection.network.backbone import ResNetBackbone, load_backbone_weights
from vramkit.tasks.text_detection.network.db_head import DBHead
from vramkit.tasks.text_detection.network.fpn_neck import FPNNeck

# The coarsest feature map is at stride 32 px; inputs must divide evenly so that the top-down
# additions and the final x4 upsampling land exactly on the input size.
SIZE_MULTIPLE = 32


def _init_weights(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.BatchNorm2d):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)


class DBNet(nn.Module):
    """Differentiable-binarisation text detector.

    ``backbone_width`` scales the ResNet-18 channel counts (1.0 is the paper's ResNet-18);
    ``inner_channels`` is the neck width (256 in the paper); ``k`` the binarisation steepness;
    ``backbone_weights`` an optional local file loaded with :func:`load_backbone_weights`
    (strict). The probability branch starts at ``prob_prior``.
    """

    def __init__(
        self,
        backbone_width: float = 1.0,
        inner_channels: int = 256,
        k: float = 50.0,
        backbone_weights: str | Path | None = None,
        prob_prior: float = 0.01,
    ) -> None:
        super().__init__()
        self.backbone = ResNetBackbone(width=backbone_width)
        self.neck = FPNNeck(self.backbone.out_channels, inner_channels)
        self.head = DBHead(inner_channels, k=k)
        _init_weights(self)
        self.head.init_output_layers(prob_prior)
        if backbone_weights is not None:
            load_backbone_weights(self.backbone, backbone_weights, strict=True)

    def forward(self, images: Tensor, *, training_maps: bool | None = None) -> dict[str, Tensor]:
        """Run the detector on normalised images (B, 3, H, W), H and W multiples of 32 px.

        Always returns ``prob`` (B, H, W), the text probability in [0, 1], and ``prob_logits``.
        ``thresh`` and ``binary_logits`` (B, H, W), which only the loss needs, are returned when
        ``training_maps`` is true; it defaults to ``self.training`` (pass True to compute a
        validation loss in eval mode).
        """
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        height, width = images.shape[-2:]
        if height % SIZE_MULTIPLE or width % SIZE_MULTIPLE:
            raise ValueError(
                f"image height and width must be multiples of {SIZE_MULTIPLE} px, "
                f"got {height}x{width}; pad or resize the input"
            )
        if training_maps is None:
            training_maps = self.training
        features = self.neck(self.backbone(images))
        outputs = self.head(features, with_threshold=training_maps)
        outputs["prob"] = torch.sigmoid(outputs["prob_logits"])
        return outputs
