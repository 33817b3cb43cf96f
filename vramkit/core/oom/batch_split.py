"""Cut a batch into micro-batches along its sample dimension, whatever the collate produced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def slice_batch(batch: Any, start: int, stop: int, size: int) -> Any:
    """Samples ``[start, stop)`` of a batch of ``size`` samples, with the batch's structure.

    Per-sample parts are sliced: tensors whose first dimension is ``size``, and lists or
    tuples of ``size`` items that are not themselves batched tensors (file names, polygons,
    per-image dicts). Everything else is kept whole in every micro-batch: scalars, counts
    such as DBNet's ``skipped``, tensors of another length. Mappings become plain dicts and
    named tuples keep their type.
    """
    if not 0 <= start < stop <= size:
        raise ValueError(f"cannot take samples [{start}, {stop}) of a batch of {size}")
    return _slice(batch, start, stop, size)


def _slice(item: Any, start: int, stop: int, size: int) -> Any:
    if isinstance(item, torch.Tensor):
        return item[start:stop] if item.dim() > 0 and item.shape[0] == size else item
    if isinstance(item, Mapping):
        return {key: _slice(value, start, stop, size) for key, value in item.items()}
    if isinstance(item, tuple) and hasattr(item, "_fields"):
        return type(item)(*(_slice(value, start, stop, size) for value in item))
    if isinstance(item, (list, tuple)):
        if len(item) == size and not _is_batched_tensor(item[0] if item else None, size):
            return item[start:stop]
        # A structure such as TensorDataset's [inputs, targets]: slice each part.
        return type(item)(_slice(value, start, stop, size) for value in item)
    return item


def _is_batched_tensor(item: Any, size: int) -> bool:
    return isinstance(item, torch.Tensor) and item.dim() > 0 and item.shape[0] == size
