"""Optimizer state layouts as a CUDA run would hold them, including ones that need a GPU library.

- The configured torch optimizer (AdamW, Adam, SGD with momentum…) runs as it is, switched to
  its multi-tensor (`foreach`) implementation, which is what torch picks for CUDA parameters:
  AdamW then allocates a parameter-sized temporary (the square roots) during each step.
- `AdamW8bitLayout` holds bitsandbytes' 8-bit AdamW states (one byte per element per moment
  plus an fp32 absmax per block of 256 elements, 2048 before bitsandbytes 0.44; 32-bit states
  for tensors under 4096 elements; the two 256-entry fp32 quantization maps once) and updates
  in place, as its fused kernel does (`bitsandbytes/optim/optimizer.py`, `Optimizer2State.
  init_state`).
- `PagedAdamWLayout` is bitsandbytes' `PagedAdamW` / `PagedAdamW32bit` (32-bit states) and
  `PagedAdamW8bit`: the moments of every tensor of at least 1e5 elements live in CUDA unified
  memory (`get_state_buffer` -> `functional.get_paged`, `cudaMallocManaged`), outside the caching
  allocator and `torch.cuda.max_memory_allocated`, and are planned as host memory
  (`paged_state_bytes`); smaller tensors' moments and the 8-bit absmax stay device memory.
- `ZeroStage2Layout` is DeepSpeed ZeRO stage 2 as Lightning configures it: 16-bit parameters
  on the device, two reduce buckets of 2e8 elements, and either the fp32 master weights and
  Adam moments partitioned across the devices or, with CPU offload, kept in host memory.

`bitsandbytes` and `deepspeed` are not needed to plan with them: these classes only allocate
what those libraries would allocate on the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from vramkit.core.planner.cuda.cuda_rules import (
    BITSANDBYTES_MIN_8BIT_SIZE,
    BITSANDBYTES_MIN_PAGED_SIZE,
    BITSANDBYTES_QMAP_ENTRIES,
    DEEPSPEED_BUCKET_ELEMENTS,
)
from vramkit.core.quantization.bitsandbytes_rules import optimizer_8bit_block, planned_bitsandbytes

CONFIGURED = "configured"
ADAMW_8BIT = "adamw_8bit"
PAGED_ADAMW = "paged_adamw"
PAGED_ADAMW_32BIT = "paged_adamw_32bit"
PAGED_ADAMW_8BIT = "paged_adamw_8bit"
ZERO2 = "zero2"
ZERO2_OFFLOAD = "zero2_offload"
BITSANDBYTES_LAYOUTS = (ADAMW_8BIT, PAGED_ADAMW, PAGED_ADAMW_32BIT, PAGED_ADAMW_8BIT)
"""Layouts of bitsandbytes optimizers: a plan with one names the bitsandbytes rules it applied."""
PAGED_LAYOUTS = {PAGED_ADAMW: 32, PAGED_ADAMW_32BIT: 32, PAGED_ADAMW_8BIT: 8}
"""Paged layouts and the bits of their states."""
LAYOUTS = (CONFIGURED, *BITSANDBYTES_LAYOUTS, ZERO2, ZERO2_OFFLOAD)
BITSANDBYTES_TARGETS = {
    "bitsandbytes.optim.AdamW8bit": ADAMW_8BIT,
    "bitsandbytes.optim.PagedAdamW8bit": PAGED_ADAMW_8BIT,
    "bitsandbytes.optim.PagedAdamW": PAGED_ADAMW,
    "bitsandbytes.optim.PagedAdamW32bit": PAGED_ADAMW_32BIT,
}
"""Optimizer targets that need a GPU library at construction time, and the layout each is
planned with; the planner only needs the hyper-parameters, so it builds the equivalent torch
optimizer and then the layout (bitsandbytes/optim/adamw.py: PagedAdamW is 32-bit and paged)."""


def use_cuda_defaults(optimizer: torch.optim.Optimizer) -> None:
    """Switch `optimizer` to the implementation torch picks for CUDA parameters (`foreach`).

    Only where the user left the choice to torch: explicit `foreach` or `fused` settings stay.
    """
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None and not group.get("fused"):
            group["foreach"] = True


def host_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """State tensors a CUDA run keeps in host memory, not on the device.

    Adam, AdamW and their kin create `state["step"]` on the parameter's device only for fused
    or capturable groups; the default (`foreach`) puts it on the CPU (torch/optim/adam.py,
    `_init_group`: `torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")`).
    """
    tensors = []
    for group in optimizer.param_groups:
        if group.get("fused") or group.get("capturable"):
            continue
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, torch.Tensor):
                tensors.append(step)
    return tensors


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps between steps (moments, momentum buffers…)."""
    tensors = []
    for state in optimizer.state.values():
        tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return tensors


class AdamW8bitLayout(torch.optim.Optimizer):
    """bitsandbytes' `AdamW8bit` as device memory: 8-bit moments with block-wise fp32 scales."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": float(weight_decay)}
        super().__init__(params, defaults)
        self.block = optimizer_8bit_block(planned_bitsandbytes().version)
        self.qmaps: list[torch.Tensor] = []

    @classmethod
    def like(cls, optimizer: torch.optim.Optimizer) -> AdamW8bitLayout:
        """The 8-bit layout for the parameters and hyper-parameters of `optimizer`."""
        groups = [
            {
                "params": group["params"],
                "lr": group.get("lr", 1e-3),
                "betas": group.get("betas", (0.9, 0.999)),
                "eps": group.get("eps", 1e-8),
                "weight_decay": group.get("weight_decay", 1e-2),
            }
            for group in optimizer.param_groups
        ]
        return cls(groups)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        """Create the states on the first step, then update in place (no temporaries)."""
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(self._initial_state(param))
                param.add_(param.grad, alpha=-group["lr"])

    def _initial_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        if param.numel() < BITSANDBYTES_MIN_8BIT_SIZE:
            return {
                "state1": torch.zeros_like(param, dtype=torch.float32),
                "state2": torch.zeros_like(param, dtype=torch.float32),
            }
        blocks = math.ceil(param.numel() / self.block)
        qmap1, qmap2 = self._quantization_maps(param.device)
        return {
            "state1": torch.zeros_like(param, dtype=torch.uint8),
            "state2": torch.zeros_like(param, dtype=torch.uint8),
            "qmap1": qmap1,
            "qmap2": qmap2,
            "absmax1": torch.zeros(blocks, dtype=torch.float32, device=param.device),
            "absmax2": torch.zeros(blocks, dtype=torch.float32, device=param.device),
        }

    def _quantization_maps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # `name2qmap["dynamic"]` and `["udynamic"]`: created once, shared by every state.
        if not self.qmaps:
            self.qmaps = [
                torch.zeros(BITSANDBYTES_QMAP_ENTRIES, dtype=torch.float32, device=device)
                for _ in range(2)
            ]
        return self.qmaps[0], self.qmaps[1]


class PagedAdamWLayout(AdamW8bitLayout):
    """bitsandbytes' paged AdamW with `bits` (8 or 32) per state element.

    The moments of tensors of at least `BITSANDBYTES_MIN_PAGED_SIZE` elements are paged: they
    are not device tensors of this optimizer (the trace does not count them) but host memory,
    `paged_bytes` in all. Everything else is what the unpaged optimizer of `bits` holds.
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict], bits: int = 32, **kw):
        super().__init__(params, **kw)
        if bits not in (8, 32):
            raise ValueError(f"bitsandbytes optimizers keep 8 or 32 bits per state, not {bits}")
        self.bits = bits
        self.paged_bytes = 0

    @classmethod
    def like_paged(cls, optimizer: torch.optim.Optimizer, bits: int) -> PagedAdamWLayout:
        """The paged layout for the parameters and hyper-parameters of `optimizer`."""
        layout = cls(AdamW8bitLayout.like(optimizer).param_groups, bits=bits)
        return layout

    def _initial_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        eight_bit = self.bits == 8 and param.numel() >= BITSANDBYTES_MIN_8BIT_SIZE
        state = (
            super()._initial_state(param)
            if eight_bit
            else {
                "state1": torch.zeros_like(param, dtype=torch.float32),
                "state2": torch.zeros_like(param, dtype=torch.float32),
            }
        )
        if param.numel() >= BITSANDBYTES_MIN_PAGED_SIZE:
            for name in ("state1", "state2"):
                moment = state.pop(name)
                self.paged_bytes += moment.numel() * moment.element_size()
        return state


def paged_state_bytes(parameters: Iterable[torch.Tensor], bits: int) -> int:
    """Host (unified) memory of a paged bitsandbytes AdamW's moments for `parameters` (bytes).

    `Optimizer.get_state_buffer`: tensors of at least 1e5 elements get `F.get_paged` buffers;
    each holds two moments of 1 byte per element (8-bit, from 4096 elements) or 4 bytes.
    """
    total = 0
    for param in parameters:
        numel = param.numel()
        if numel < BITSANDBYTES_MIN_PAGED_SIZE:
            continue
        per_element = 1 if bits == 8 and numel >= BITSANDBYTES_MIN_8BIT_SIZE else 4
        total += 2 * numel * per_element
    return total


class ZeroStage2Layout(torch.optim.Optimizer):
    """DeepSpeed ZeRO-2 on one of `world_size` devices, optionally offloading to the CPU.

    Gradients leave the device as they are produced (`sink_gradient`): to host memory with
    offload, else reduced to this device's 1/`world_size` partition. Two reduce buckets of
    16-bit elements stay allocated. Without offload each step keeps fp32 master weights and
    both Adam moments for the partition, and converts the gradient partition to fp32.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        world_size: int,
        offload: bool,
        bucket_dtype: torch.dtype,
        bucket_elements: int = DEEPSPEED_BUCKET_ELEMENTS,
    ) -> None:
        super().__init__(list(params), {})
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.offload = offload
        device = self.param_groups[0]["params"][0].device
        self.buckets = [
            torch.empty(bucket_elements, dtype=bucket_dtype, device=device) for _ in range(2)
        ]
        self.gradient_partitions: dict[torch.Tensor, torch.Tensor] = {}

    def partition_size(self, param: torch.Tensor) -> int:
        """Elements of `param` this device keeps state for."""
        return math.ceil(param.numel() / self.world_size)

    def sink_gradient(self, param: torch.Tensor) -> None:
        """Move a finished gradient out of the parameter, as DeepSpeed's hooks do."""
        grad = param.grad
        if grad is None:
            return
        param.grad = None
        if not self.offload:
            self.gradient_partitions[param] = grad.flatten()[: self.partition_size(param)].clone()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients and the kept gradient partitions."""
        super().zero_grad(set_to_none=set_to_none)
        self.gradient_partitions.clear()

    def device_gradients(self) -> list[torch.Tensor]:
        """Gradient memory held on the device: the buckets and the kept partitions."""
        return [*self.buckets, *self.gradient_partitions.values()]

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        """Offload: the host updates (nothing on the device). Else: a partitioned fp32 Adam."""
        if self.offload:
            return
        for param, partition in self.gradient_partitions.items():
            state = self.state[param]
            if not state:
                size = self.partition_size(param)
                for name in ("master", "exp_avg", "exp_avg_sq"):
                    state[name] = torch.zeros(size, dtype=torch.float32, device=param.device)
            fp32_grad = partition.float()
            state["exp_avg"].add_(fp32_grad)
            del fp32_grad
