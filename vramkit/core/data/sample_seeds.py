"""Per-sample random seeds: a sample's augmentation depends on the run's seed, the epoch and the
sample, never on which process loaded it or what that process loaded before.

A loader worker's random generators advance with every sample it prepares, and its workers
prefetch batches ahead of training, so the random state a sample sees depends on the number of
workers, on prefetching and on where the iteration started. A run resumed in the middle of an
epoch (new workers, a new base seed) would therefore augment the rest of that epoch differently
from the run it continues. Here each sample instead arrives as a :class:`SampleKey` that carries
its own seed, and :class:`SeededSamples` seeds Python's ``random``, NumPy's global generator and
torch's CPU generator with it before the dataset's ``__getitem__`` runs: a sample is augmented
the same way with 0 or 4 workers, in a straight run or a resumed one.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

_NUMPY_SEED_MODULUS = 2**32  # np.random.seed takes seeds in [0, 2**32)


class SampleKey(NamedTuple):
    """What a sampler hands the loader instead of a bare index: the sample and its seed."""

    index: int
    seed: int


def mixed_seed(*parts: int) -> int:
    """A 64-bit seed made from non-negative integers, e.g. (order seed, epoch, sample index).

    NumPy's ``SeedSequence`` mixes them so that neighbouring epochs or indices give unrelated
    seeds (a sum would give the same seed to many pairs), about 25 us a call.
    """
    state = np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)
    return int(state[0])


@contextlib.contextmanager
def seeded_global_generators(seed: int) -> Iterator[None]:
    """Seed ``random``, NumPy's global generator and torch's CPU generator with ``seed`` (64 bits).

    In the training process (a loader without workers) their previous states come back
    afterwards, so loading a sample leaves the training step's random numbers (dropout, ...)
    as they were. A worker process has no other use for them and skips that (NumPy's state
    round trip costs about 0.15 ms).
    """
    in_worker = get_worker_info() is not None
    saved = None
    if not in_worker:
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    random.seed(seed)
    np.random.seed(seed % _NUMPY_SEED_MODULUS)
    # The default generator alone: torch.manual_seed would also seed every accelerator's
    # generators, about 0.25 ms per call even on a CPU-only build.
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


class SeededSamples(Dataset):
    """``dataset`` whose samples are looked up by :class:`SampleKey`, under the key's seed.

    A plain ``int`` index still works (the planner and tools read single samples that way) and
    leaves the generators alone.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: SampleKey | int) -> Any:
        if isinstance(key, SampleKey):
            with seeded_global_generators(key.seed):
                return self.dataset[key.index]
        return self.dataset[key]
