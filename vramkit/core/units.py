"""Byte units, so that every message and metric means the same thing by a GiB."""

from __future__ import annotations

GIB = 2**30
"""Bytes in a gibibyte; memory figures in vramkit are GiB, as `torch.cuda` reports them."""
MIB = 2**20
"""Bytes in a mebibyte."""


def gib(size: int | float | None) -> float | None:
    """``size`` bytes in GiB; None stays None."""
    return None if size is None else size / GIB
