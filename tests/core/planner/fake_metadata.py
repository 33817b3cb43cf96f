"""What the planner's direct outputs must share with the fake mode's: a tensor's metadata."""

from __future__ import annotations

import torch


def metadata(value: torch.Tensor | None) -> tuple | None:
    """Type, shape, strides, offset, dtype, device, storage bytes and requires_grad (None: None)."""
    if value is None:
        return None
    return (
        type(value),
        tuple(value.shape),
        value.stride(),
        value.storage_offset(),
        value.dtype,
        value.device,
        value.untyped_storage().nbytes(),
        value.requires_grad,
    )
