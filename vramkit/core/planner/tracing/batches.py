"""Batches for the planner: one real sample per phase, grown to any batch size as fake tensors.

The datamodule is asked for one item of its training and of its validation dataset, collated
with the loader's own `collate_fn`; that fixes every per-sample shape and dtype (crops, maps,
token ids). `grow_batch` then builds a batch of B samples with the same shapes: tensors get B
in their first dimension (created under the caller's fake mode, so nothing is allocated) and
per-sample Python lists (polygons, names) are repeated B times. A datamodule that pads text
dynamically gives the first sample's length: pad to a fixed `max_length` to plan the worst case,
or state each item's length (`ItemLengths`): the longest item is then the sample.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader, IterableDataset

from vramkit.core.planner.errors import PlanningDataError

_SAMPLES_TRIED = 16  # items tried before giving up on a split whose items fail to load


@runtime_checkable
class PlanningSetup(Protocol):
    """A datamodule that sets itself up for the planner with less work than `setup("fit")`."""

    def setup_for_planning(self) -> None:
        """Make `train_dataloader()` and `val_dataloader()` usable, in place of `prepare_data()`
        and `setup("fit")`: datasets of their full length whose items are those a run gets,
        without work that only a run needs (e.g. checking every annotation file, or every
        file's checksum). A later `prepare_data()` / `setup()` must still do that work."""


@runtime_checkable
class ItemLengths(Protocol):
    """A dataset or batch sampler that states each item's length (the SAGE datasets and their
    length-bucketing sampler): batches are padded to their longest item, so the planner samples
    the longest, the worst case a batch can take."""

    lengths: Sequence[int]
    """One length per item (tokens), in item order."""


def _item_lengths(loader: DataLoader, size: int) -> list[int] | None:
    for holder in (loader.dataset, loader.batch_sampler):
        if isinstance(holder, ItemLengths) and len(holder.lengths) == size:
            return [int(length) for length in holder.lengths]
    return None


@dataclass(frozen=True)
class PhaseSamples:
    """One collated sample (batch size 1) per phase and the size of each dataset."""

    train: Any
    val: Any
    train_size: int | None
    """Training samples (None when the dataset has no length); caps the training batch."""
    val_size: int | None
    """Validation samples (None when unknown); caps the validation batch."""
    after_transfer: Callable[[Any], Any] | None = None
    """The datamodule's `on_after_batch_transfer` (batch → batch), when it has its own: what
    the step sees (e.g. float inputs made from compact uint8 batches)."""
    train_dataset: Any = field(default=None, repr=False, compare=False)
    """The training loader's dataset, for the host plan (what each loader worker copies)."""
    val_dataset: Any = field(default=None, repr=False, compare=False)


def _first_loader(loaders: Any, split: str) -> DataLoader:
    if isinstance(loaders, DataLoader):
        return loaders
    if isinstance(loaders, (list, tuple)) and loaders and isinstance(loaders[0], DataLoader):
        return loaders[0]
    if isinstance(loaders, dict) and loaders:
        first = next(iter(loaders.values()))
        if isinstance(first, DataLoader):
            return first
    raise PlanningDataError(
        f"{split}_dataloader() returned {type(loaders).__name__}; the planner needs a DataLoader"
    )


def _has_tensor(batch: Any) -> bool:
    if isinstance(batch, torch.Tensor):
        return True
    if isinstance(batch, Mapping):
        return any(_has_tensor(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return any(_has_tensor(v) for v in batch)
    return False


def _one_sample(loader: DataLoader, split: str) -> tuple[Any, int | None]:
    dataset = loader.dataset
    collate = loader.collate_fn
    if isinstance(dataset, IterableDataset):
        candidates = iter(dataset)
        size = None
    else:
        size = len(dataset)  # type: ignore[arg-type]
        if size == 0:
            raise PlanningDataError(f"the {split} dataset is empty")
        order = list(range(min(size, _SAMPLES_TRIED)))
        lengths = _item_lengths(loader, size)
        if lengths is not None:
            longest = max(range(size), key=lengths.__getitem__)
            order = [longest, *(i for i in order if i != longest)]
        candidates = (dataset[i] for i in order)
    for _, item in zip(range(_SAMPLES_TRIED), candidates, strict=False):
        if item is None:
            continue
        batch = collate([item])
        if _has_tensor(batch):
            return batch, size
    raise PlanningDataError(
        f"none of the first {_SAMPLES_TRIED} {split} samples gave a batch with tensors"
    )


def sample_batches(datamodule: L.LightningDataModule) -> PhaseSamples:
    """Prepare and set up `datamodule` for fitting (`PlanningSetup` when it has it); return
    one collated sample per phase."""
    if isinstance(datamodule, PlanningSetup):
        datamodule.setup_for_planning()
    else:
        datamodule.prepare_data()
        datamodule.setup("fit")
    train_loader = _first_loader(datamodule.train_dataloader(), "train")
    val_loader = _first_loader(datamodule.val_dataloader(), "val")
    train, train_size = _one_sample(train_loader, "train")
    val, val_size = _one_sample(val_loader, "val")
    after_transfer = None
    if is_overridden("on_after_batch_transfer", datamodule):
        after_transfer = functools.partial(datamodule.on_after_batch_transfer, dataloader_idx=0)
    return PhaseSamples(
        train=train,
        val=val,
        train_size=train_size,
        val_size=val_size,
        after_transfer=after_transfer,
        train_dataset=train_loader.dataset,
        val_dataset=val_loader.dataset,
    )


def cast_floating(batch: Any, dtype: torch.dtype | None) -> Any:
    """`batch` with every floating tensor cast to `dtype` (what Lightning's `*-true` precisions
    do to inputs); None leaves it as it is."""
    if dtype is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, Mapping):
        return {key: cast_floating(value, dtype) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(cast_floating(value, dtype) for value in batch)
    return batch


def grow_batch(sample: Any, batch_size: int) -> Any:
    """A batch of `batch_size` samples shaped like the collated single `sample`.

    Tensors are new (uninitialised: call under a fake mode) with the first dimension set to
    `batch_size`. Mappings become dicts. A list or tuple of length 1 without
    tensors is one sample's annotations and is repeated; other values are kept.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    def grow(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            shape = (batch_size, *value.shape[1:]) if value.dim() else ()
            return torch.empty(shape, dtype=value.dtype)
        if isinstance(value, Mapping):
            return {key: grow(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            if len(value) == 1 and not _has_tensor(value):
                return type(value)(value) * batch_size  # one sample's annotations
            return type(value)(grow(item) for item in value)
        return value

    return grow(sample)
