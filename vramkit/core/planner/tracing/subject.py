"""The model to plan: the task's real LightningModule, built without allocating its weights.

`build_module` calls the request's module factory under the meta device (no memory, no
initialisation cost, so a 1.3B-parameter Hugging Face model built from its config takes a
second), runs
`configure_model` (undoing `torch.compile`: the planner traces eager code), and then gives
every parameter and buffer a fake CPU tensor of the same shape and of the precision's dtype.
`build_optimizer` calls the module's own `configure_optimizers` and applies the layout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from unittest import mock

import lightning as L
import torch
from lightning.pytorch.core.optimizer import _configure_optimizers
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.cuda_rules import parameter_dtype
from vramkit.core.planner.cuda.optimizer_layouts import (
    ADAMW_8BIT,
    CONFIGURED,
    PAGED_LAYOUTS,
    ZERO2,
    ZERO2_OFFLOAD,
    AdamW8bitLayout,
    PagedAdamWLayout,
    ZeroStage2Layout,
    use_cuda_defaults,
)
from vramkit.core.planner.errors import PlanningError
from vramkit.core.planner.tracing.checkpointing import enable_gradient_checkpointing
from vramkit.core.planner.tracing.run_setup import RunSetup


class _PlanningTrainer:
    """What `configure_optimizers` may read from a Trainer while the planner builds it."""

    def __init__(self, setup: RunSetup, max_epochs: int, max_steps: int) -> None:
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        # Only schedules read this; its value does not change memory.
        self.estimated_stepping_batches = max_steps if max_steps > 0 else 1000
        self.accumulate_grad_batches = setup.accumulate_grad_batches
        self.world_size = setup.devices
        self.num_devices = setup.devices
        self.global_step = 0
        self.current_epoch = 0
        self.is_global_zero = True
        self.precision = setup.precision

    def __getattr__(self, name: str) -> Any:
        raise PlanningError(
            f"configure_optimizers() reads trainer.{name}, which the memory planner does not "
            "provide (it builds the optimizer without a Trainer)"
        )


def _no_compile(module: nn.Module, *args: Any, **kwargs: Any) -> None:
    """`nn.Module.compile` while the planner configures the model: the trace runs eager code."""


def _undo_compile(module: nn.Module) -> None:
    for sub in module.modules():
        if getattr(sub, "_compiled_call_impl", None) is not None:
            sub._compiled_call_impl = None


def _fake_like(tensor: torch.Tensor, dtype: torch.dtype, fake_mode: FakeTensorMode) -> torch.Tensor:
    target = dtype if tensor.is_floating_point() else tensor.dtype
    with fake_mode:
        return torch.empty_strided(tensor.size(), tensor.stride(), dtype=target, device="cpu")


KEEPS_OWN_DTYPES = "keeps_own_dtypes"
"""The LightningModule with this attribute true keeps every floating tensor's dtype when made
fake (a recipe's mixed dtypes: bf16 base weights and fp32 adapters, a k-bit model's fp32 norms);
a submodule with it true keeps its buffers' dtypes (a quantized layer's fp32 state)."""


def materialize_fake(module: nn.Module, dtype: torch.dtype, fake_mode: FakeTensorMode) -> None:
    """Replace every parameter and buffer by a fake CPU tensor; floating ones take `dtype`
    unless `module` keeps its own dtypes, or, for buffers, their submodule (`KEEPS_OWN_DTYPES`).

    Shared (tied) parameters stay shared.
    """
    made: dict[int, torch.Tensor] = {}
    keep_all = getattr(module, KEEPS_OWN_DTYPES, False)
    for sub in module.modules():
        keep_buffers = keep_all or getattr(sub, KEEPS_OWN_DTYPES, False)
        for name, param in list(sub._parameters.items()):
            if param is None:
                continue
            if id(param) not in made:
                data = _fake_like(param, param.dtype if keep_all else dtype, fake_mode)
                made[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
            sub._parameters[name] = made[id(param)]
        for name, buffer in list(sub._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in made:
                kept = buffer.dtype if keep_buffers else dtype
                made[id(buffer)] = _fake_like(buffer, kept, fake_mode)
            sub._buffers[name] = made[id(buffer)]


def build_module(
    factory: Callable[[], Any], setup: RunSetup, fake_mode: FakeTensorMode
) -> L.LightningModule:
    """The LightningModule `factory` builds, with fake weights, in training mode, as `setup`
    runs it."""
    return finish_module(build_meta_module(factory), setup, fake_mode)


def build_meta_module(factory: Callable[[], Any]) -> L.LightningModule:
    """The LightningModule `factory` builds, configured (`configure_model`), its weights on the
    meta device; `finish_module` makes it traceable."""
    with torch.device("meta"):
        module = factory()
    if not isinstance(module, L.LightningModule):
        raise PlanningError(
            f"the model builds a {type(module).__name__}, not a LightningModule: the planner "
            "runs the module's training_step and validation_step"
        )
    if not module.automatic_optimization:
        raise PlanningError(
            f"{type(module).__name__} uses manual optimization; the planner simulates "
            "Lightning's automatic optimization loop only"
        )
    # `nn.Module.compile` only sets `_compiled_call_impl = torch.compile(self._call_impl, ...)`
    # (torch/nn/modules/module.py), which `_undo_compile` sets back to None; making that callable
    # imports torch._inductor.compile_fx, 0.7-0.9 s of CPU for nothing.
    with torch.device("meta"), mock.patch.object(nn.Module, "compile", _no_compile):
        module.configure_model()
    _undo_compile(module)
    return module


def finish_module(
    module: L.LightningModule, setup: RunSetup, fake_mode: FakeTensorMode
) -> L.LightningModule:
    """`module` (from `build_meta_module`) with fake weights, in training mode, as `setup`
    runs it."""
    materialize_fake(module, parameter_dtype(setup.precision), fake_mode)
    if setup.gradient_checkpointing and enable_gradient_checkpointing(module) == 0:
        raise PlanningError(
            f"{type(module).__name__} has no repeated blocks to checkpoint (no Sequential or "
            "ModuleList of layers, no Hugging Face gradient_checkpointing_enable)"
        )
    module.train()
    return module


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that get gradients, each once."""
    return [p for p in module.parameters() if p.requires_grad]


def _configured_optimizer(
    module: L.LightningModule, setup: RunSetup, max_epochs: int, max_steps: int
) -> torch.optim.Optimizer:
    module._trainer = _PlanningTrainer(setup, max_epochs, max_steps)
    try:
        optimizers, _, _ = _configure_optimizers(module.configure_optimizers())
    finally:
        module._trainer = None
    if len(optimizers) != 1:
        raise PlanningError(
            f"configure_optimizers() returned {len(optimizers)} optimizers; the planner "
            "simulates one optimizer"
        )
    return optimizers[0]


def _is_adam(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))


def build_optimizer(
    module: L.LightningModule,
    setup: RunSetup,
    *,
    configured_layout: str | None = None,
    max_epochs: int = 1,
    max_steps: int = -1,
) -> torch.optim.Optimizer:
    """The optimizer a run of `setup` would step, holding `module`'s (fake) parameters."""
    optimizer = _configured_optimizer(module, setup, max_epochs, max_steps)
    layout = setup.optimizer
    if layout == CONFIGURED and configured_layout is not None:
        layout = configured_layout
    if layout == CONFIGURED:
        use_cuda_defaults(optimizer)
        return optimizer
    if layout == ADAMW_8BIT or layout in PAGED_LAYOUTS:
        if not _is_adam(optimizer):
            raise PlanningError(
                f"bitsandbytes' {layout} replaces Adam/AdamW; the model's optimizer is "
                f"{type(optimizer).__name__}"
            )
        if layout in PAGED_LAYOUTS:
            return PagedAdamWLayout.like_paged(optimizer, PAGED_LAYOUTS[layout])
        return AdamW8bitLayout.like(optimizer)
    if layout in (ZERO2, ZERO2_OFFLOAD):
        return ZeroStage2Layout(
            _param_list(optimizer),
            world_size=setup.devices,
            offload=layout == ZERO2_OFFLOAD,
            bucket_dtype=parameter_dtype(setup.precision),
        )
    raise PlanningError(f"unknown optimizer layout {layout!r}")


def _param_list(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]
