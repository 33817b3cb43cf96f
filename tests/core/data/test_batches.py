"""Counting the samples of a batch, whatever its structure."""

from __future__ import annotations

import warnings

import torch

from vramkit.core.data.batches import batch_size_of


def test_batch_size_is_the_first_tensors_leading_size():
    batch = {"skipped": 1, "names": ["a", "b"], "image": torch.zeros(2, 3, 8, 8)}
    assert batch_size_of(batch) == 2
    assert batch_size_of([torch.zeros(5, 3), torch.zeros(4)]) == 5
    assert batch_size_of((torch.zeros(()), {"x": torch.zeros(3, 1)})) == 3  # 0-d is no batch


def test_a_batch_without_tensors_has_no_size():
    assert batch_size_of({"skipped": 4}) is None  # every image unreadable
    assert batch_size_of([]) is None
    assert batch_size_of("text") is None


def test_per_sample_lists_beside_tensors_raise_no_warning():
    batch = {"image": torch.zeros(2, 3), "name": ["a", "b"], "polygons": [[], []]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert batch_size_of(batch) == 2
