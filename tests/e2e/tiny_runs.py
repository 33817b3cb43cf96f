"""What several end-to-end tests share: a toy-size ARC setup and a flat view of checkpoint trees."""

from __future__ import annotations

from typing import Any

import torch

# Two ARC tasks, one demonstration each, a one-layer 16-wide network: a SAGE run in seconds.
TINY_ARC = (
    "data.limit_tasks=2",
    "data.max_demos=1",
    "model.net.d_model=16",
    "model.net.num_layers=1",
    "model.net.num_heads=2",
    "model.net.ffn_dim=32",
)
# The same on the CPU profile, in the training process, 4 examples per batch.
TINY_ARC_ON_CPU = (
    "+hw=cpu",
    "hw.num_workers=0",
    "hw.batch_size=4",
    "hw.val_batch_size=4",
    *TINY_ARC,
)


def flat_tensors(tree: dict[Any, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """``{"a.b": tensor}`` for every tensor in a nested dict (a state_dict, optimizer state)."""
    flat: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flat_tensors(value, f"{prefix}{key}."))
        elif isinstance(value, torch.Tensor):
            flat[f"{prefix}{key}"] = value
    return flat
