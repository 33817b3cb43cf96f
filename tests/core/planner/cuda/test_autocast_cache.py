"""The emulated autocast cache empties when real autocast's does, recomputation included."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from vramkit.core.planner.cuda.autocast_rules import CudaAutocast


def test_nothing_of_the_cache_is_alive_after_a_checkpointed_backward():
    layers = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    x = torch.randn(4, 32, requires_grad=True)
    with CudaAutocast(torch.float16) as autocast:
        with autocast.region():
            y = checkpoint(layers, x, use_reentrant=False)
            assert autocast._cache  # fp16 copies of the weights, cached inside the region
        assert not autocast._cache
        y.float().sum().backward()  # recomputes the segment in an autocast region of its own
        assert not autocast._cache
    assert torch.clear_autocast_cache is not autocast._clear_caches  # torch's own again


def test_a_region_keeps_its_casts_until_it_exits():
    layer = nn.Linear(8, 8)
    with CudaAutocast(torch.float16) as autocast, autocast.region():
        first = layer(torch.randn(2, 8))
        cached = dict(autocast._cache)
        second = layer(torch.randn(2, 8))
        assert first.dtype == second.dtype == torch.float16
        assert autocast._cache.keys() == cached.keys()  # the weight was cast once
