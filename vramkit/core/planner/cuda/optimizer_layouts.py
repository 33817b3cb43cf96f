"""Optimizer state layouts as a CUDA run would hold them, including ones that need a GPU library.

- The configured torch optimizer (AdamW, Adam, SGD with momentum…) runs as it is, switched to
  its multi-tensor (`foreach`) implementation, which is what torch picks for CUDA parameters:
  AdamW then allocates a parameter-sized temporary (the square roots) during each step.
- `AdamW8bitLayout` holds bitsandbytes' 8-bit AdamW states (one byte per element per moment
  plus an fp32 absmax per 256-element block; 32-bit states for tensors under 4096 elements)
  and updates in place, as its fused kernel does.
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
    BITSANDBYTES_BLOCK,
    BITSANDBYTES_MIN_8BIT_SIZE,
    DEEPSPEED_BUCKET_ELEMENTS,
)

CONFIGURED = "configured"
ADAMW_8BIT = "adamw_8bit"
ZERO2 = "zero2"
ZERO2_OFFLOAD = "zero2_offload"
LAYOUTS = (CONFIGURED, ADAMW_8BIT, ZERO2, ZERO2_OFFLOAD)


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

    @staticmethod
    def _initial_state(param: torch.Tensor) -> dict[str, torch.Tensor]:
        if param.numel() < BITSANDBYTES_MIN_8BIT_SIZE:
            return {
                "state1": torch.zeros_like(param, dtype=torch.float32),
                "state2": torch.zeros_like(param, dtype=torch.float32),
            }
        blocks = math.ceil(param.numel() / BITSANDBYTES_BLOCK)
        return {
            "state1": torch.zeros_like(param, dtype=torch.uint8),
            "state2": torch.zeros_like(param, dtype=torch.uint8),
            "absmax1": torch.zeros(blocks, dtype=torch.float32, device=param.device),
            "absmax2": torch.zeros(blocks, dtype=torch.float32, device=param.device),
        }


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
