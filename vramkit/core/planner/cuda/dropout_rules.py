"""Dropout as CUDA runs it, for `F.dropout` on CPU tensors.

`aten::dropout` (aten/src/ATen/native/Dropout.cpp) takes the fused kernel only where
`is_fused_kernel_acceptable` holds: a CUDA (XPU, lazy, privateuse1) tensor, 0 < p < 1 and at
least one element. Then `native_dropout` (aten/src/ATen/native/cuda/Dropout.cu, `dropout_cuda`)
returns the output and a **bool** mask, and its backward (`native_dropout_backward`,
tools/autograd/derivatives.yaml) saves that 1-byte-per-element mask. A CPU tensor takes
`_dropout_impl` instead: a noise tensor in the input's dtype (4 bytes per element in fp32) is
drawn, scaled and kept for the backward of `input * noise`. On the SAGE student at batch 8 that
float mask was about 2.1 GiB of the planned training peak that a GPU never holds.

`CudaDropout` replaces `aten::dropout`'s autograd kernel for CPU tensors, while entered, with the
CUDA decision, and sends the fused case to `native_dropout`, whose CPU kernel also returns (and
saves) a bool mask; the other cases behave as `_dropout_impl` does.
"""

from __future__ import annotations

import torch

from vramkit.core.planner.cuda.kernel_overrides import KernelOverrides


class CudaDropout:
    """`F.dropout` allocates and saves what CUDA's fused dropout does, while entered."""

    def __init__(self) -> None:
        self.fused_calls = 0
        """Calls that took the fused kernel (a trace can report them)."""
        self._overrides = KernelOverrides()

    def __enter__(self) -> CudaDropout:
        self._overrides.register({"dropout": self._dropout}, "AutogradCPU")
        return self

    def __exit__(self, *exc: object) -> None:
        self._overrides.remove()

    def _dropout(self, input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        if 0 < p < 1 and input.numel() > 0:
            if not train:
                return input
            self.fused_calls += 1
            return torch.ops.aten.native_dropout(input, p, train)[0]
        if p == 0 or not train or input.numel() == 0:
            return input
        return input * torch.zeros((), dtype=input.dtype, device=input.device)  # p == 1
