"""build_loader: the worker settings every task's loader shares."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from vramkit.core.data.loader_workers import init_loader_worker
from vramkit.core.data.loaders import build_loader

DATA = TensorDataset(torch.arange(10))


def _collate(items):
    return torch.stack([item[0] for item in items])


def test_without_workers_the_worker_settings_are_left_out():
    loader = build_loader(
        DATA,
        collate_fn=_collate,
        num_workers=0,
        pin_memory=False,
        batch_size=4,
        prefetch_factor=8,
    )
    assert loader.worker_init_fn is None and not loader.persistent_workers
    assert loader.prefetch_factor is None
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_workers_are_initialised_persistent_and_prefetch_as_asked():
    loader = build_loader(
        DATA,
        collate_fn=_collate,
        num_workers=2,
        pin_memory=False,
        batch_size=4,
        shuffle=True,
        drop_last=True,
        prefetch_factor=3,
    )
    assert loader.worker_init_fn is init_loader_worker
    assert loader.persistent_workers and loader.prefetch_factor == 3
    assert loader.drop_last and len(loader) == 2
    transient = build_loader(
        DATA,
        collate_fn=_collate,
        num_workers=1,
        pin_memory=False,
        batch_size=4,
        persistent_workers=False,
    )
    assert not transient.persistent_workers


def test_a_batch_sampler_decides_the_batches():
    sampler = [[9, 0], [1, 2, 3]]
    loader = build_loader(
        DATA, collate_fn=_collate, num_workers=0, pin_memory=False, batch_sampler=sampler
    )
    assert [batch.tolist() for batch in loader] == [[9, 0], [1, 2, 3]]
