"""SAGE's length-bucketed batches: padding, an order fixed by (seed, epoch), and a loader that a
checkpoint restarts at its next batch with the same augmented examples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.data import _replace_dunder_methods
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

from vramkit.core.data.resumable_loader import ResumableDataLoader
from vramkit.core.data.sample_seeds import SampleKey
from vramkit.tasks.sage.data.arc_batching import LengthBucketBatchSampler, grid_loader

LENGTHS = [3, 9, 4, 7, 5, 8, 2, 6, 9, 3, 5, 7, 4]


class AugmentedSequences(Dataset):
    """Item i: a sequence of LENGTHS[i] tokens, each i + a draw of torch's generator (an
    augmentation that reads the global generator, as ArcAugmentedDataset does)."""

    lengths = LENGTHS

    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        length = LENGTHS[index]
        shift = int(torch.randint(1000, ()))
        tokens = torch.full((length,), index * 1000 + shift)
        zeros = torch.zeros(length, dtype=torch.long)
        return {"tokens": tokens, "rows": zeros, "cols": zeros, "roles": zeros, "pairs": zeros}


def _loader(seed: int, workers: int = 0) -> ResumableDataLoader:
    torch.manual_seed(seed)  # grid_loader takes the order seed from torch.initial_seed()
    loader = grid_loader(
        AugmentedSequences(), LENGTHS, 3, shuffle=True, num_workers=workers, pin_memory=False
    )
    assert isinstance(loader, ResumableDataLoader)
    return loader


def _epoch(loader: ResumableDataLoader, epoch: int) -> list[list[int]]:
    loader.batch_sampler.set_epoch(epoch)
    return [batch["tokens"][:, 0].tolist() for batch in loader]


def test_batches_hold_every_index_once_in_length_buckets():
    sampler = LengthBucketBatchSampler(
        range(len(LENGTHS)), 3, lengths=LENGTHS, shuffle=True, seed=1, pool_batches=2
    )
    batches = list(sampler)
    assert all(isinstance(key, SampleKey) for batch in batches for key in batch)
    indices = [key.index for batch in batches for key in batch]
    assert sorted(indices) == list(range(len(LENGTHS)))
    assert len(batches) == len(sampler) == 5


def test_the_order_depends_on_seed_and_epoch_only():
    def order(seed: int, epoch: int) -> list[list[int]]:
        sampler = LengthBucketBatchSampler(
            range(len(LENGTHS)), 3, lengths=LENGTHS, shuffle=True, seed=seed
        )
        sampler.set_epoch(epoch)
        return [[key.index for key in batch] for batch in sampler]

    torch.manual_seed(0)
    before = torch.get_rng_state()
    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)
    assert torch.equal(torch.get_rng_state(), before), "the sampler drew from torch's generator"


@pytest.mark.parametrize("workers", [0, 1])
def test_a_loader_resumed_mid_epoch_gives_the_rest_of_that_epoch(workers):
    straight = _epoch(_loader(7, workers), 1)
    interrupted = _loader(7, workers)
    interrupted.batch_sampler.set_epoch(1)
    batches = iter(interrupted)
    first = [next(batches)["tokens"][:, 0].tolist() for _ in range(2)]
    state = interrupted.state_dict()
    assert state == {"order_seed": 7, "epoch": 1, "batches_done": 2}

    resumed = _loader(99, workers)  # the seed comes from the checkpoint, not this process
    resumed.load_state_dict(state)
    assert [*first, *_epoch(resumed, 1)] == straight
    assert _epoch(resumed, 2) == _epoch(_loader(7, workers), 2), "only the resumed pass is cut"


def test_examples_are_augmented_alike_with_and_without_workers():
    assert _epoch(_loader(7, 0), 0) == _epoch(_loader(7, 1), 0)
    assert _epoch(_loader(7, 0), 0) != _epoch(_loader(7, 0), 1)


def test_validation_batches_follow_length_and_draw_nothing():
    sampler = LengthBucketBatchSampler(range(len(LENGTHS)), 4, lengths=LENGTHS, shuffle=False)
    batches = list(sampler)
    assert batches[0] == [6, 0, 9, 2]  # the shortest first, ties in index order
    lengths = [LENGTHS[i] for batch in batches for i in batch]
    assert lengths == sorted(lengths) and all(isinstance(i, int) for b in batches for i in b)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(len(LENGTHS)))


def test_each_process_buckets_its_own_share_under_a_distributed_sampler():
    shares = []
    for rank in (0, 1):
        share = DistributedSampler(range(len(LENGTHS)), num_replicas=2, rank=rank, seed=3)
        sampler = LengthBucketBatchSampler(share, 3, lengths=LENGTHS, shuffle=True, seed=1)
        sampler.set_epoch(1)
        assert share.epoch == 1, "the epoch reaches the distributed sampler"
        shares.append([key.index for batch in sampler for key in batch])
        assert len(list(sampler)) == len(sampler) == 3  # 7 indices per process (one repeated)
    assert set(shares[0]) | set(shares[1]) == set(range(len(LENGTHS)))


def test_lightning_recreates_the_loader_around_its_distributed_sampler():
    """What Lightning does to a training loader under DDP (data_connector._request_dataloader
    records the init arguments, _update_dataloader re-creates the loader with its sampler)."""
    with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
        loader = _loader(7)
    share = DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=True, seed=0)
    recreated = _update_dataloader(loader, share, mode=RunningStage.TRAINING)
    assert isinstance(recreated, ResumableDataLoader)
    assert isinstance(recreated.batch_sampler, LengthBucketBatchSampler)
    assert recreated.batch_sampler.sampler is share
    assert len(recreated) == 3 and recreated.state_dict()["order_seed"] == 7
