"""PyTorch's CUDA caching allocator, replayed on a traced step's allocations and frees.

`torch.cuda.max_memory_reserved()` is what the allocator took from the driver (`cudaMalloc`
segments), not what tensors use: a 1.5 MiB tensor takes a 20 MiB segment, freed blocks stay cached,
and a request larger than every cached block takes a new segment while smaller free blocks sit
unused. Reserved over allocated measured 1.00-1.20 depending on how a model's tensors are sized, so
one factor cannot be right for every model; replaying the step's own allocation pattern through the
allocator's rules gives the reserve of that pattern.

The rules, read from `c10/cuda/CUDACachingAllocator.cpp` (constants in `c10/core/AllocatorConfig.h`)
with the default configuration (no `max_split_size_mb`, no expandable segments, one stream):

- a request is rounded up to a multiple of 512 B; requests up to 1 MiB come from the small pool,
  larger ones from the large pool;
- the allocator takes the smallest cached free block of the pool that is large enough (best fit,
  lowest address first among equals);
- none: a new segment of 2 MiB (small pool), 20 MiB (large requests under 10 MiB), or the request
  rounded up to 2 MiB;
- a block larger than the request is split when the rest is at least 512 B (small pool) or more
  than 1 MiB (large pool); otherwise the request gets the whole block;
- a freed block merges with free neighbours of its segment and returns to its pool; segments are
  never given back (no `empty_cache` inside a step).

Out-of-memory retries (freeing cached segments and trying again) are not modelled: the model
gives what the allocator reserves when nothing forces it to give memory back, an upper bound.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from vramkit.core.units import MIB

MIN_BLOCK = 512
"""Every request is rounded up to a multiple of this (bytes)."""
SMALL_SIZE = 1 * MIB
"""The largest request served from the small pool."""
SMALL_SEGMENT = 2 * MIB
"""The segment size of the small pool."""
LARGE_SEGMENT = 20 * MIB
"""The segment size for large requests under `MIN_LARGE_ALLOC`."""
MIN_LARGE_ALLOC = 10 * MIB
"""Requests from here on get a segment of their own size, rounded to `ROUND_LARGE`."""
ROUND_LARGE = 2 * MIB


def round_request(nbytes: int) -> int:
    """A request's size as the allocator hands it out (bytes)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(request: int) -> int:
    """The size of the segment a new `cudaMalloc` takes for a rounded `request` (bytes)."""
    if request <= SMALL_SIZE:
        return SMALL_SEGMENT
    if request < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-request // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    """The block belongs to a small-pool segment (and returns to the small pool)."""
    free: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


class CachingAllocatorModel:
    """Segments and cached blocks of one device's caching allocator (see the module docstring)."""

    def __init__(self) -> None:
        self.reserved = 0
        self.max_reserved = 0
        self.allocated = 0
        self.max_allocated = 0
        self._pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._by_key: dict[tuple[int, int, int], _Block] = {}
        self._live: dict[object, _Block] = {}
        self._segments = 0

    def malloc(self, handle: object, nbytes: int) -> None:
        """Allocate `nbytes` for `handle` (any hashable name of the allocation)."""
        size = round_request(nbytes)
        small = size <= SMALL_SIZE
        block = self._best_fit(small, size)
        if block is None:
            block = _Block(self._segments, offset=0, size=segment_size(size), small=small)
            self._segments += 1
            self.reserved += block.size
            self.max_reserved = max(self.max_reserved, self.reserved)
        else:
            self._take(small, block)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = _Block(
                block.segment, block.offset + size, remaining, small, prev=block, next=block.next
            )
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._give(small, rest)
        block.free = False
        self._live[handle] = block
        self.allocated += block.size
        self.max_allocated = max(self.max_allocated, self.allocated)

    def free(self, handle: object) -> None:
        """Return `handle`'s block to its pool, merged with free neighbours."""
        block = self._live.pop(handle)
        small = block.small
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._take(small, neighbour)
                block = self._merge(block, neighbour)
        self._give(small, block)

    @staticmethod
    def _merge(block: _Block, neighbour: _Block) -> _Block:
        first, second = sorted((block, neighbour), key=lambda b: b.offset)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _best_fit(self, small: bool, size: int) -> _Block | None:
        pool = self._pools[small]
        index = bisect.bisect_left(pool, (size, -1, -1))
        if index == len(pool):
            return None
        return self._by_key[pool[index]]

    def _take(self, small: bool, block: _Block) -> None:
        pool = self._pools[small]
        pool.pop(bisect.bisect_left(pool, block.key))
        del self._by_key[block.key]

    def _give(self, small: bool, block: _Block) -> None:
        bisect.insort(self._pools[small], block.key)
        self._by_key[block.key] = block


def replay_reserved(events: list[tuple[int, int]]) -> int:
    """The most bytes the allocator reserves over `events`: (serial, +bytes) allocates, (serial, 0)
    frees."""
    model = CachingAllocatorModel()
    for serial, nbytes in events:
        if nbytes:
            model.malloc(serial, nbytes)
        else:
            model.free(serial)
    return model.max_reserved
