"""The shuffled loader: order fixed by (seed, epoch), a position a checkpoint restores, samples
augmented the same with any number of workers, and no draw from the global generators."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from vramkit.core.data.loaders import build_loader
from vramkit.core.data.resumable_loader import EpochOrder, ResumableDataLoader
from vramkit.core.data.sample_seeds import SampleKey, SeededSamples


class RandomlyAugmented(Dataset):
    """Sample i: (i, a draw of torch, of NumPy and of Python's random), like an augmentation."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> torch.Tensor:
        draws = [torch.randint(10**6, ()).item(), np.random.randint(10**6), random.randrange(10**6)]
        return torch.tensor([index, *draws])


def _loader(workers: int = 0, seed: int = 7) -> ResumableDataLoader:
    torch.manual_seed(seed)  # build_loader takes the order seed from torch.initial_seed()
    loader = build_loader(
        RandomlyAugmented(),
        collate_fn=torch.stack,
        num_workers=workers,
        pin_memory=False,
        batch_size=3,
        shuffle=True,
        drop_last=True,
    )
    assert isinstance(loader, ResumableDataLoader)
    return loader


def _epoch(loader: DataLoader, epoch: int) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    return [batch.tolist() for batch in loader]


def test_the_order_depends_on_seed_and_epoch_only():
    order = EpochOrder(10, seed=7)
    assert sorted(order.order(0)) == list(range(10))
    assert order.order(0) == EpochOrder(10, seed=7).order(0)
    assert order.order(0) != order.order(1)
    assert order.order(0) != EpochOrder(10, seed=8).order(0)
    assert EpochOrder(4, seed=7, shuffle=False).order(3) == [0, 1, 2, 3]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_loader_resumed_mid_epoch_gives_the_rest_of_that_epoch(workers):
    straight = _epoch(_loader(workers), 1)
    interrupted = _loader(workers)
    interrupted.sampler.set_epoch(1)
    first = next(iter(interrupted))
    state = interrupted.state_dict()
    assert state == {"order_seed": 7, "epoch": 1, "batches_done": 1}

    resumed = _loader(workers, seed=99)  # the seed comes from the checkpoint, not this process
    resumed.load_state_dict(state)
    rest = _epoch(resumed, 1)
    assert [first.tolist(), *rest] == straight
    assert resumed.state_dict()["batches_done"] == len(straight)
    assert _epoch(resumed, 2) == _epoch(_loader(workers), 2), "only the resumed pass is skipped"


def test_a_position_saved_at_the_end_of_an_epoch_starts_the_next_one_whole():
    finished = _loader()
    _epoch(finished, 0)
    resumed = _loader()
    resumed.load_state_dict(finished.state_dict())
    assert _epoch(resumed, 1) == _epoch(_loader(), 1)


def test_samples_are_augmented_alike_with_and_without_workers():
    assert _epoch(_loader(0), 0) == _epoch(_loader(1), 0)
    assert _epoch(_loader(0), 0) != _epoch(_loader(0), 1)


def test_loading_samples_leaves_the_training_process_generators_alone():
    shuffled = _loader()
    torch.manual_seed(0)
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    _epoch(shuffled, 0)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert random.getstate() == before[2]


def test_a_plain_index_reads_the_sample_without_seeding():
    samples = SeededSamples(RandomlyAugmented())
    assert len(samples) == 10 and samples[3][0] == 3
    assert torch.equal(samples[SampleKey(3, 5)], samples[SampleKey(3, 5)])
    assert not torch.equal(samples[SampleKey(3, 5)], samples[SampleKey(3, 6)])


def test_unshuffled_loaders_stay_plain_keep_their_order_and_draw_nothing():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    loader = build_loader(
        list(range(10)), collate_fn=torch.tensor, num_workers=1, pin_memory=False, batch_size=4
    )
    assert type(loader) is DataLoader
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert torch.equal(torch.get_rng_state(), before), "the workers' base seed came from torch"
