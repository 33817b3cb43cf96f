"""Batching ARC sequences: padding to the longest sequence of a batch, and length buckets.

ARC sequences range from ~20 to the full ``max_length`` tokens; batching sequences of similar
length keeps the padding (computed, then thrown away) small, which matters most on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from vramkit.core.data.loaders import build_loader
from vramkit.core.data.sample_seeds import SampleKey, mixed_seed
from vramkit.tasks.sage.grids.grid_tokens import NO_POSITION, PAD

# sequence fields and the value that pads them; every other field has a fixed shape
SEQUENCE_PADDING = {"tokens": PAD, "rows": NO_POSITION, "cols": NO_POSITION, "roles": 0, "pairs": 0}
FEATURES_KEY = "teacher_features"  # (length, width) per item, padded with zeros


def collate_grid_items(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack items into a batch; sequences are right-padded and ``padding_mask`` marks the pad.

    ``padding_mask`` is (B, L) bool, True at padding (PyTorch's ``key_padding_mask`` convention).
    """
    if not items:
        raise ValueError("cannot collate an empty batch")
    lengths = torch.tensor([item["tokens"].shape[0] for item in items])
    longest = int(lengths.max())
    batch: dict[str, torch.Tensor] = {}
    for key, value in SEQUENCE_PADDING.items():
        padded = torch.full((len(items), longest), value, dtype=items[0][key].dtype)
        for row, item in enumerate(items):
            padded[row, : item[key].shape[0]] = item[key]
        batch[key] = padded
    batch["padding_mask"] = torch.arange(longest)[None, :] >= lengths[:, None]
    if FEATURES_KEY in items[0]:
        first = items[0][FEATURES_KEY]
        features = torch.zeros((len(items), longest, first.shape[1]), dtype=first.dtype)
        for row, item in enumerate(items):
            features[row, : item[FEATURES_KEY].shape[0]] = item[FEATURES_KEY]
        batch[FEATURES_KEY] = features
    for key in items[0]:
        if key not in batch:
            batch[key] = torch.stack([item[key] for item in items])
    return batch


class LengthBucketBatchSampler(BatchSampler):
    """Batches of the indices ``sampler`` yields, grouped by similar ``lengths``, resumable at any
    batch.

    With ``shuffle``, the indices are shuffled, cut into pools of ``pool_batches`` batches, each
    pool sorted by length and cut into batches, and the batches shuffled; every draw comes from a
    generator seeded by (``seed``, epoch), and each index arrives as a
    :class:`~vramkit.core.data.sample_seeds.SampleKey` whose seed is (``seed``, epoch, index),
    so an epoch's batches and every example's augmentation are the same in a straight run and
    in one resumed in the middle of the epoch (a
    :class:`~vramkit.core.data.resumable_loader.ResumableOrder`, counted in batches). Without
    ``shuffle``, batches follow the length order, which is deterministic.

    It is a ``BatchSampler`` whose first argument is the ``sampler``, so under DDP Lightning
    re-creates it around its ``DistributedSampler`` (``lightning/pytorch/utilities/data.py``,
    ``_dataloader_init_kwargs_resolve_sampler``) and each process buckets its own share.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Sequence[int],
        batch_size: int,
        drop_last: bool = False,
        *,
        lengths: Sequence[int],
        shuffle: bool,
        seed: int = 0,
        pool_batches: int = 50,
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = torch.as_tensor(lengths, dtype=torch.long)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.pool_batches = pool_batches
        self._start = 0  # batch the next pass starts at (a resumed epoch)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next pass on (Lightning calls it every epoch)."""
        self.epoch = epoch
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)  # a DistributedSampler shuffles per epoch

    def start_next_pass_at(self, position: int) -> None:
        """Skip the first ``position`` batches of the next pass only."""
        self._start = position

    def __iter__(self) -> Iterator[list[SampleKey] | list[int]]:
        start, self._start = self._start, 0
        indices = torch.as_tensor(list(self.sampler), dtype=torch.long)
        if not self.shuffle:
            order = indices[torch.argsort(self.lengths[indices], stable=True)]
            yield from self._cut(order)[start:]
            return
        epoch = self.epoch
        generator = torch.Generator().manual_seed(mixed_seed(self.seed, epoch))
        order = indices[torch.randperm(len(indices), generator=generator)]
        pool = self.batch_size * self.pool_batches
        batches = []
        for first in range(0, len(order), pool):
            chunk = order[first : first + pool]
            chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)]
            # pools hold whole batches, so only the last pool can end in a short one
            batches.extend(self._cut(chunk))
        for index in torch.randperm(len(batches), generator=generator).tolist()[start:]:
            yield [SampleKey(i, mixed_seed(self.seed, epoch, i)) for i in batches[index]]

    def _cut(self, order: torch.Tensor) -> list[list[int]]:
        batches = [
            order[start : start + self.batch_size].tolist()
            for start in range(0, len(order), self.batch_size)
        ]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches


def grid_loader(
    dataset: Dataset,
    lengths: Sequence[int],
    batch_size: int,
    *,
    shuffle: bool,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool = True,
) -> DataLoader:
    """A loader of length-bucketed, padded grid batches (see :class:`LengthBucketBatchSampler`),
    its order seed the run's (``torch.initial_seed()``, set by ``seed_everything``)."""
    sampler = LengthBucketBatchSampler(
        range(len(lengths)), batch_size, lengths=lengths, shuffle=shuffle, seed=torch.initial_seed()
    )
    return build_loader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        collate_fn=collate_grid_items,
    )
