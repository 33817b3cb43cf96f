"""Compact text-detection batches from the loader → float model inputs, on the device.

Loader workers send each sample as augmentation leaves it: the image as (3, H, W) uint8 RGB and
the binary maps (``shrink_map``, ``shrink_mask``, ``thresh_mask``) as uint8; only
``thresh_map`` is float32. A 640 px sample is then 4.1 MB instead of 11.5 MB of float32, and
every copy on its way pays for that: into the worker's shared memory, into pinned memory, over
PCIe. The float conversion and the ImageNet normalisation run here, after the transfer, where a
GPU does them in microseconds (the LightningModule calls :func:`to_model_inputs` from
``on_after_batch_transfer``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # per RGB channel, of values scaled to [0, 1]
IMAGENET_STD = (0.229, 0.224, 0.225)  # per RGB channel, of values scaled to [0, 1]
MAP_KEYS = ("shrink_map", "shrink_mask", "thresh_map", "thresh_mask")
# Maps that hold only 0 and 1 by construction (targets.py): sent as uint8, exactly.
BINARY_MAP_KEYS = ("shrink_map", "shrink_mask", "thresh_mask")


def image_to_tensor(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 RGB array → (3, H, W) uint8 tensor, the layout the network reads."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 image, got {image.dtype} {image.shape}")
    return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))


def normalize_images(
    images: torch.Tensor, dtype: torch.dtype = torch.float32, *, channels_last: bool = False
) -> torch.Tensor:
    """(B, 3, H, W) uint8 RGB → ``dtype``, scaled to [0, 1] and ImageNet-normalised per channel.

    Computed in float32 as ``(v / 255 - mean) / std``, then cast: the numbers the float32
    pipeline of the reference implementations gives. The constants are Python scalars: a
    constant tensor built per batch would be a blocking host-to-device copy on every step.
    With ``channels_last`` the result is laid out NHWC: the float conversion makes a new tensor
    anyway, so writing it in the network's layout spares the network a copy of the batch.
    """
    if images.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images, got {images.dtype}")
    layout = torch.channels_last if channels_last else torch.contiguous_format
    normalised = images.to(torch.float32, memory_format=layout).mul_(1.0 / 255.0)
    for channel, (mean, std) in enumerate(zip(IMAGENET_MEAN, IMAGENET_STD, strict=True)):
        normalised[:, channel].sub_(mean).div_(std)
    return normalised.to(dtype)


def to_model_inputs(
    batch: dict[str, Any],
    dtype: torch.dtype = torch.float32,
    *,
    maps: bool = True,
    channels_last: bool = False,
) -> dict[str, Any]:
    """The batch with a normalised ``dtype`` image and ``dtype`` target maps; the rest as is.

    A floating image is taken as normalised already (a datamodule that does its own) and only
    cast. A batch without ``image`` (every image unreadable) passes through unchanged. With
    ``maps=False`` the target maps stay as they came (what needs no loss: validation).
    ``channels_last`` lays the normalised image out NHWC (:func:`normalize_images`).
    """
    if "image" not in batch:
        return batch
    converted = dict(batch)
    image = batch["image"]
    converted["image"] = (
        image.to(dtype)
        if image.is_floating_point()
        else normalize_images(image, dtype, channels_last=channels_last)
    )
    for key in MAP_KEYS if maps else ():
        if key in batch:
            converted[key] = batch[key].to(dtype)
    return converted
