"""What a CUDA device does with memory that a trace on CPU tensors cannot see by itself.

The planner traces fake CPU tensors (a CPU build of torch cannot run autograd on fake `cuda`
tensors) and applies these rules so that the numbers are the ones a CUDA run would produce:

- the caching allocator rounds every block up to 512 B (`round_allocation`);
- it reserves more than it hands out (segments, cached blocks: the step's own allocations are
  replayed through `allocator_model`), and the CUDA context and library workspaces take memory
  no tracer sees (`overhead_bytes`);
- mixed precision casts per CUDA's autocast op lists (`autocast_rules`), and the attention
  kernel follows the compute capability (`sdpa_backend`, `attention_rules`);
- optimizers default to their multi-tensor (`foreach`) implementation on CUDA, which
  allocates a parameter-sized temporary list during AdamW's step.

The allowances are stated constants (docs/hardware.md "Hardware facts behind the profiles", with
their sources), not measurements of this run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vramkit.core.planner.cuda.allocator_model import replay_reserved
from vramkit.core.planner.cuda.op_rules import cublas_workspace_bytes
from vramkit.core.units import GIB

ALLOCATION_GRANULE = 512
"""The CUDA caching allocator rounds every block up to a multiple of this many bytes."""

RESERVE_FLOOR_FACTOR = 1.12
"""The least reserved / allocated the plan assumes at a peak (workspaces included). The allocator
replay of the two traced steps is often lower (BERT-large at batch 4 on a V100: 1.1 GiB below
what NVML showed over a whole run, whose steps keep fragmenting the cache); measured ratios run
1.00-1.20 (docs/hardware.md "Hardware facts"), and a plan that reads low is the one that crashes."""

CUDA_CONTEXT_GIB = 0.60
"""CUDA context, loaded kernels and library handles outside the caching allocator, with lazy
module loading: NVML "used" minus `max_memory_reserved` read 0.60 GiB on an A10G in every
optimum-benchmark CUDA report (PyTorch 2.x). PyTorch sets `CUDA_MODULE_LOADING=LAZY` unless the
user did (`aten/src/ATen/cuda/detail/CUDAHooks.cpp`, `initCUDA`); lazy loading shipped in CUDA 11.7
(CUDA C++ Programming Guide, "Lazy Loading")."""

CUDA_CONTEXT_EAGER_GIB = 1343 / 1024
"""The same with every kernel loaded at start-up (CUDA before 11.7, or `CUDA_MODULE_LOADING=EAGER`):
1343 MiB measured by `torch.ones((1, 1)).to("cuda")` on a V100 (transformers docs, "Model training
anatomy")."""

BITSANDBYTES_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps 32-bit states for tensors with fewer elements than this (`min_8bit_size`,
the default of every 8-bit optimizer in `bitsandbytes/optim/`)."""

BITSANDBYTES_MIN_PAGED_SIZE = 100_000
"""A paged bitsandbytes optimizer pages the states of tensors with at least this many elements
(`Optimizer.get_state_buffer`: ``if not self.is_paged or p.numel() < 1e5``), same since 0.39."""

BITSANDBYTES_QMAP_ENTRIES = 256
"""Entries of each of the two fp32 quantization maps of an 8-bit optimizer (`fill_qmap`)."""

DEEPSPEED_BUCKET_ELEMENTS = 200_000_000
"""Lightning's DeepSpeedStrategy default reduce/allgather bucket size (elements)."""

GRAD_SCALER_INIT_SCALE = 65536.0
"""The loss scale `torch.amp.GradScaler` starts with under `16-mixed`."""

MIXED_PRECISIONS = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
TRUE_PRECISIONS = {
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
    "32-true": torch.float32,
    "64-true": torch.float64,
}

FLASH = "flash"
EFFICIENT = "efficient"
MATH = "math"


def lazy_module_loading() -> bool:
    """Whether this process's CUDA would load kernels lazily (see `CUDA_CONTEXT_GIB`).

    A CPU build (no CUDA version) plans for a current CUDA build, which loads lazily.
    """
    if os.environ.get("CUDA_MODULE_LOADING", "LAZY").upper() == "EAGER":
        return False
    if torch.version.cuda is None:
        return True
    major, minor = (int(part) for part in torch.version.cuda.split(".")[:2])
    return (major, minor) >= (11, 7)


def round_allocation(nbytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request of `nbytes` (0 stays 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // ALLOCATION_GRANULE) * ALLOCATION_GRANULE


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The lower-precision dtype autocast uses under `precision`; None without autocast."""
    return MIXED_PRECISIONS.get(precision)


def parameter_dtype(precision: str) -> torch.dtype:
    """The dtype parameters, gradients and optimizer states are kept in under `precision`."""
    return TRUE_PRECISIONS.get(precision, torch.float32)


@dataclass(frozen=True)
class DeviceRules:
    """The facts of the target GPU that change memory: capability and attention kernels."""

    capability: tuple[int, int]
    """CUDA compute capability (major, minor)."""
    flash_attention: bool
    """PyTorch's flash SDPA kernel is available (sm_80+)."""
    mem_efficient_attention: bool
    """PyTorch's memory-efficient SDPA kernel is available."""
    lazy_module_loading: bool = True
    """CUDA loads kernels on first use (CUDA >= 11.7 and PyTorch's default); False for older
    CUDA or `CUDA_MODULE_LOADING=EAGER`, whose context is twice as large."""

    def cuda_context_bytes(self) -> int:
        """Device memory the CUDA context and libraries hold outside the allocator (bytes)."""
        gib = CUDA_CONTEXT_GIB if self.lazy_module_loading else CUDA_CONTEXT_EAGER_GIB
        return round(gib * GIB)

    def cublas_workspace_bytes(self) -> int:
        """cuBLAS workspace of one handle (bytes) on this capability, or as
        `CUBLAS_WORKSPACE_CONFIG` sets it (`op_rules.cublas_workspace_bytes`)."""
        return cublas_workspace_bytes(self.capability, os.environ)

    def workspace_bytes(self, *, backward: bool) -> int:
        """Library workspaces held for the whole step, outside the trace (bytes).

        Autograd runs the backward pass on its own thread, which gets a second cuBLAS handle
        and workspace. cuDNN's convolution workspaces are not here: each is a temporary of its
        op, which the trace charges where the convolution runs
        (`op_rules.cudnn_convolution_workspace_bytes`).
        """
        return sum(self.workspace_sizes(backward=backward))

    def workspace_sizes(self, *, backward: bool) -> list[int]:
        """The persistent library workspaces the caching allocator hands out, one size each."""
        return [self.cublas_workspace_bytes()] * (2 if backward else 1)

    def overhead_bytes(
        self,
        allocated_peak: int,
        events: Sequence[tuple[int, int]],
        *,
        backward: bool,
    ) -> int:
        """Device memory beyond the traced allocations at the peak (bytes).

        The CUDA context, plus what the caching allocator reserves beyond the blocks in use:
        the step's allocation `events` ((serial, bytes) allocates, (serial, 0) frees), after the
        library workspaces, replayed through `allocator_model`, and never less than
        `RESERVE_FLOOR_FACTOR` times the blocks in use.
        """
        workspaces = [
            (-1 - index, size) for index, size in enumerate(self.workspace_sizes(backward=backward))
        ]
        replayed = replay_reserved([*workspaces, *events])
        in_blocks = allocated_peak + sum(size for _, size in workspaces)
        reserved = max(replayed, round(RESERVE_FLOOR_FACTOR * in_blocks))
        return self.cuda_context_bytes() + reserved - allocated_peak

    def sdpa_backend(
        self,
        dtype: torch.dtype,
        head_dim: int,
        *,
        has_mask: bool,
        same_head_dims: bool = True,
    ) -> str:
        """The SDPA kernel PyTorch picks on this device: "flash", "efficient" or "math".

        Flash needs sm_80+, fp16/bf16, no explicit mask and a head dimension up to 256.
        Memory-efficient attention takes masks and fp32, but bf16 only on sm_80+; both need
        the head dimension aligned (8 elements in 16 bit, 4 in fp32). Everything else runs the
        math path, which materialises the attention matrix (about twice the memory).
        """
        sixteen_bit = dtype in (torch.float16, torch.bfloat16)
        if (
            self.flash_attention
            and self.capability >= (8, 0)
            and sixteen_bit
            and not has_mask
            and same_head_dims
            and head_dim <= 256
            and head_dim % 8 == 0
        ):
            return FLASH
        dtype_ok = dtype in (torch.float16, torch.float32) or (
            dtype == torch.bfloat16 and self.capability >= (8, 0)
        )
        alignment = 8 if sixteen_bit else 4
        if self.mem_efficient_attention and dtype_ok and head_dim % alignment == 0:
            return EFFICIENT
        return MATH
