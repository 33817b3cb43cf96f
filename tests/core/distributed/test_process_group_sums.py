"""Two gloo processes with half a batch each compute what one process computes on the whole
batch: BatchNorm statistics and their gradients, DBNet's batch-pooled loss, the sampler's order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from vramkit.core.distributed.process_sums import share_of_largest
from vramkit.core.distributed.sync_batchnorm import (
    CpuSyncBatchNorm,
    ProcessGroupBatchNorm,
    convert_batchnorm,
)

WORKER = Path(__file__).with_name("gloo_worker.py")
# float32 sums of a few hundred terms in another order (two partial sums then their sum, instead
# of one pass) differ by a few ulp of the total: ~1e-6 relative, so 1e-5 absolute on O(1) values.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, run_process_pair) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("gloo")
    return run_process_pair(WORKER, str(out_dir), out_dir=out_dir)


@pytest.mark.slow
def test_halves_on_two_processes_give_the_whole_batch_result(ranks):
    for result in ranks:
        assert result["synced_type"] == "ProcessGroupBatchNorm"
        for name, difference in result["differences"].items():
            assert difference < TOLERANCE, (name, difference)


@pytest.mark.slow
def test_the_two_shares_interleave_one_order_with_the_same_sample_seeds(ranks):
    first, second = ranks
    order = first["full_order"]
    assert first["share"] == order[0::2] and second["share"] == order[1::2]
    seeds = dict(zip(first["share"], first["seeds"], strict=True))
    seeds.update(zip(second["share"], second["seeds"], strict=True))
    assert len(seeds) == 10 and len(set(seeds.values())) == 10


def test_one_process_normalises_as_plain_batchnorm():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3))
    converted = convert_batchnorm(nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)))
    converted.load_state_dict(plain.state_dict())
    assert isinstance(converted[1], ProcessGroupBatchNorm)
    images = torch.randn(4, 2, 5, 5)
    torch.testing.assert_close(converted(images), plain(images))
    torch.testing.assert_close(converted[1].running_var, plain[1].running_var)


def test_revert_gives_each_layer_its_class_back_with_the_same_parameters():
    model = nn.Sequential(nn.Conv1d(2, 3, 1), nn.BatchNorm1d(3))
    weight = model[1].weight
    restored = CpuSyncBatchNorm().revert(CpuSyncBatchNorm().apply(model))
    assert type(restored[1]) is nn.BatchNorm1d
    assert restored[1].weight is weight


def test_values_tied_at_the_boundary_share_its_places():
    values = torch.tensor([3.0, 2.0, 2.0, 2.0, 1.0], requires_grad=True)
    total = share_of_largest(values, 2, torch.tensor(2.0), across=False)
    total.backward()
    assert total.item() == 5.0  # what topk(values, 2) sums
    torch.testing.assert_close(values.grad, torch.tensor([1.0, 1 / 3, 1 / 3, 1 / 3, 0.0]))
