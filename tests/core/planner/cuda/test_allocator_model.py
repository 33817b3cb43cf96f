"""The caching allocator model reserves what PyTorch's CUDA caching allocator would."""

from __future__ import annotations

import pytest

from vramkit.core.planner.cuda.allocator_model import (
    CachingAllocatorModel,
    replay_reserved,
    round_request,
    segment_size,
)
from vramkit.core.units import MIB


@pytest.mark.parametrize(
    ("request_bytes", "segment"),
    [
        (1, 2 * MIB),  # small pool: 2 MiB segments
        (MIB, 2 * MIB),  # 1 MiB is still small
        (MIB + 512, 20 * MIB),  # large requests under 10 MiB share 20 MiB segments
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),  # from 10 MiB: the request, rounded up to 2 MiB
        (11 * MIB, 12 * MIB),
    ],
)
def test_segment_sizes(request_bytes, segment):
    assert segment_size(round_request(request_bytes)) == segment


def test_small_requests_pack_into_one_small_segment():
    assert replay_reserved([(i, 1000) for i in range(100)]) == 2 * MIB


def test_a_freed_block_is_reused_and_split():
    model = CachingAllocatorModel()
    model.malloc("a", 40 * MIB)
    model.free("a")
    model.malloc("b", 30 * MIB)  # best fit: the cached 40 MiB block, split (10 MiB > 1 MiB rest)
    model.malloc("c", 8 * MIB)  # fits in the 10 MiB rest
    assert model.max_reserved == 40 * MIB


def test_a_rest_of_one_mib_or_less_is_not_split_off_large_blocks():
    model = CachingAllocatorModel()
    model.malloc("a", 40 * MIB)
    model.free("a")
    model.malloc("b", 39 * MIB)  # 1 MiB left: the request takes the whole block
    assert model.allocated == 40 * MIB
    model.malloc("c", 512 * 1024)  # small pool: a new 2 MiB segment, not the 1 MiB rest
    assert model.reserved == 42 * MIB


def test_fragmentation_takes_a_new_segment_although_enough_is_free():
    model = CachingAllocatorModel()
    for name in "abcd":
        model.malloc(name, 20 * MIB)
    model.free("a")
    model.free("c")  # 40 MiB free, but in two 20 MiB blocks of different segments
    model.malloc("e", 30 * MIB)
    assert model.max_reserved == 110 * MIB
    assert model.allocated == 70 * MIB


def test_neighbours_merge_when_freed():
    model = CachingAllocatorModel()
    model.malloc("a", 12 * MIB)
    model.free("a")
    model.malloc("b", 4 * MIB)  # from the cached 12 MiB block, split 4 + 8
    model.malloc("c", 4 * MIB)  # from the 8 MiB rest, split 4 + 4
    model.free("b")
    model.free("c")  # b, c and the rest merge back into the 12 MiB block
    model.malloc("d", 12 * MIB)
    assert model.max_reserved == 12 * MIB
