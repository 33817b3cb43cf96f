"""Kernels registered over aten's own for as long as an emulation is entered.

Every CUDA emulation of the planner (`CudaKernels`, `CudaAttention`, `CudaDropout`,
`CudaAutocast`) replaces some of aten's CPU kernels while a trace runs. One
`torch.library.Library("aten", "IMPL")` holds the replacements; destroying it gives aten its
previous kernels back. `Library._destroy` is private (torch/library.py): this module is the one
place the planner calls it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch


class KernelOverrides:
    """Replacement kernels for aten ops under one dispatch key, registered until `remove`."""

    def __init__(self) -> None:
        self._library: torch.library.Library | None = None

    def register(self, kernels: Mapping[str, Callable[..., Any]], dispatch_key: str) -> None:
        """Register `kernels` (aten op name → kernel) for `dispatch_key` ("AutogradCPU")."""
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # overriding a registered kernel warns: the point
            for name, kernel in kernels.items():
                library.impl(name, kernel, dispatch_key)
        self._library = library

    @property
    def active(self) -> bool:
        """Whether the replacements are registered now."""
        return self._library is not None

    def remove(self) -> bool:
        """Give aten its own kernels back; False when nothing was registered."""
        if self._library is None:
            return False
        self._library._destroy()
        self._library = None
        return True
