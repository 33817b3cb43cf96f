"""What every DataLoader worker process does first: keep its freed memory for reuse, and seed
its random generators as Lightning would."""

from __future__ import annotations

import ctypes
import os
import sys

from lightning.fabric.utilities.seed import pl_worker_init_function

# glibc mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's largest: blocks below this come from the heap
_TRIM_THRESHOLD_BYTES = 512 * 2**20  # free heap kept before any is given back to the kernel


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks of this process for reuse; False where the C
    library is not glibc (nothing changes there).

    A 640 px training sample allocates about 15 MB of short-lived arrays (the warped image,
    four target maps, their tensors). A loader worker's malloc serves blocks that large with
    ``mmap`` and unmaps them when freed, so every sample paid page faults and kernel zeroing to
    get the same memory back: the worker made 37-47 samples/s, 50-53 with this (2-core Xeon,
    ``benchmarks/data_pipeline.py``). The worker's memory stays at its peak working set.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
    )


def init_loader_worker(worker_id: int) -> None:
    """``worker_init_fn`` of vramkit's loaders: :func:`keep_freed_memory`, then Lightning's
    worker seeding when ``seed_everything(..., workers=True)`` asked for it (Lightning adds
    its own only to loaders without a ``worker_init_fn``)."""
    keep_freed_memory()
    if os.environ.get("PL_SEED_WORKERS") == "1":
        pl_worker_init_function(worker_id)
