"""The one builder of vramkit's DataLoaders: worker settings every task's loaders share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import Field
from torch.utils.data import DataLoader, Dataset, Sampler

from vramkit.core.config.settings import Settings
from vramkit.core.data.loader_workers import init_loader_worker
from vramkit.core.data.resumable_loader import EpochOrder, ResumableDataLoader, ResumableOrder
from vramkit.core.data.sample_seeds import SeededSamples

DEFAULT_NUM_WORKERS = 0
"""Loader worker processes where nothing says otherwise (a hardware profile, ``data.num_workers``,
a caller): 0 loads in the training process, which works on every machine. The one place this
default is written; every other ``num_workers`` default reads it."""


class LoaderSettings(Settings):
    """The ``data.*`` keys of every task's loaders (the hardware profile usually sets them)."""

    batch_size: int = Field(8, gt=0)
    """Training samples per step and device."""
    val_batch_size: int = Field(8, gt=0)
    """Validation samples per step and device."""
    num_workers: int = Field(DEFAULT_NUM_WORKERS, ge=0)
    """Loader worker processes; 0 loads in the training process."""
    pin_memory: bool = False
    """Page-locked host memory for faster host-to-GPU copies."""
    persistent_workers: bool = True
    """Loader workers, and what they built, live across epochs."""


def build_loader(
    dataset: Dataset,
    *,
    collate_fn: Callable[[list[Any]], Any],
    num_workers: int,
    pin_memory: bool,
    batch_size: int | None = None,
    shuffle: bool = False,
    drop_last: bool = False,
    batch_sampler: Sampler[list[int]] | None = None,
    persistent_workers: bool = True,
    prefetch_factor: int | None = None,
) -> DataLoader:
    """A DataLoader of ``batch_size`` samples (or the batches of ``batch_sampler``).

    A shuffled loader without a ``batch_sampler``, or one whose ``batch_sampler`` is a
    :class:`~vramkit.core.data.resumable_loader.ResumableOrder`, is a
    :class:`~vramkit.core.data.resumable_loader.ResumableDataLoader`: its order and every
    sample's random augmentation follow from the order seed and the epoch, and a checkpoint holds
    its position, so a resumed run continues at the next batch with the same samples, whatever
    the number of workers. The order seed is ``torch.initial_seed()`` (the run's ``seed``
    under ``seed_everything``); no loader draws from torch's global generator, so building and
    iterating loaders leaves the training step's random numbers alone.

    With workers, every worker runs :func:`init_loader_worker` (freed memory kept for reuse,
    Lightning's seeding) and, when ``persistent_workers``, lives across epochs, keeping what it
    built; ``prefetch_factor`` batches each are prepared ahead (PyTorch's default when None).
    Without workers those settings do not apply and are left out, as DataLoader requires.
    """
    workers = num_workers > 0
    seed = torch.initial_seed()
    common: dict[str, Any] = {
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "persistent_workers": persistent_workers and workers,
        "prefetch_factor": prefetch_factor if workers else None,
        "collate_fn": collate_fn,
        "worker_init_fn": init_loader_worker if workers else None,
        # the workers' base seed comes from here, not from torch's global generator
        "generator": torch.Generator().manual_seed(seed),
    }
    if shuffle and batch_sampler is None:
        return ResumableDataLoader(
            SeededSamples(dataset),
            sampler=EpochOrder(len(dataset), seed=seed),  # type: ignore[arg-type]
            batch_size=batch_size,
            drop_last=drop_last,
            **common,
        )
    if isinstance(batch_sampler, ResumableOrder):
        return ResumableDataLoader(SeededSamples(dataset), batch_sampler=batch_sampler, **common)
    return DataLoader(
        dataset,
        batch_size=batch_size if batch_sampler is None else 1,
        shuffle=shuffle if batch_sampler is None else False,
        drop_last=drop_last if batch_sampler is None else False,
        batch_sampler=batch_sampler,
        **common,
    )
