"""How many samples a batch holds, for every part of vramkit that counts or splits batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def batch_size_of(batch: Any) -> int | None:
    """The number of samples in ``batch``: the first dimension of its first tensor.

    Tensors are searched depth-first through mappings, lists and tuples (a dict's keys in
    order). Returns None when the batch holds no tensor with at least one dimension, for
    example DBNet's ``{"skipped": n}`` batch whose images were all unreadable.

    Not Lightning's ``extract_batch_size``: that raises on a batch without tensors and warns
    about an "ambiguous collection" for batches that carry per-sample lists of strings beside
    their tensors (DBNet's names and polygons), on every step.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    # dict before the Mapping ABC, whose isinstance test costs several times more
    if isinstance(batch, dict | Mapping):
        items = batch.values()
    elif isinstance(batch, list | tuple):
        items = batch
    else:
        return None
    for item in items:
        # a tensor at the top level, the usual case, without a recursive call (once per step)
        if isinstance(item, torch.Tensor):
            if item.dim() > 0:
                return int(item.shape[0])
            continue
        size = batch_size_of(item)
        if size is not None:
            return size
    return None
