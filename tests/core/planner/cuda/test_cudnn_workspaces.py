"""cuDNN's convolution workspace is a temporary of each convolution, not a flat allowance.

aten/src/ATen/native/cudnn/Conv_v8.cpp (`run_conv_plan`) takes the chosen engine's workspace
from the caching allocator for one call and gives it back; the plan charges it at the op, sized
by the explicit-GEMM lowering (`op_rules.cudnn_convolution_workspace_bytes`), so it counts only
where a convolution is at the peak. A convolution takes it only from free memory (`try_configs`
runs another engine on an out-of-memory error), so it raises the predicted `max_allocated`,
not the peak a budget must hold.
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.cuda_rules import DeviceRules, round_allocation
from vramkit.core.planner.decisions.plan import TRAIN, VAL, MemoryPlanner
from vramkit.core.planner.tracing.fake_trace import (
    FakeStepRecorder,
    cuda_semantics,
    trace_training,
    trace_validation,
)
from vramkit.core.planner.tracing.peak_holders import WORKSPACE
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.subject import build_module, build_optimizer
from vramkit.core.units import MIB

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)


def _trace(target, trace, image, batch_size, precision="32-true"):
    setup = RunSetup(precision=precision, device=T4)
    fake_mode = FakeTensorMode()
    config = OmegaConf.create(
        {
            "_target_": f"planning_models.{target}",
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True},
        }
    )
    module = build_module(config, setup, fake_mode)
    with cuda_semantics(setup) as (semantics, _), fake_mode:
        batch = {
            "image": torch.randn(batch_size, *image),
            "label": torch.zeros(batch_size, dtype=torch.long),
        }
        optimizer = build_optimizer(module, setup)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        return setup, trace(module, optimizer, batch, recorder, semantics)


def _workspace_at_peak(trace) -> int:
    """cuDNN workspace live at the step's max-allocated moment (bytes)."""
    return sum(holder.bytes for holder in trace.max_allocated_holders if holder.kind == WORKSPACE)


def test_a_patch_embedding_model_plans_validation_without_a_cudnn_block():
    # The field: ViT inference reserved no 128 MiB cuDNN block (the flat allowance read +39-70%
    # too high on small models). Its only convolution cuts patches at the start; the peak is in
    # the encoder, after the patch conv's workspace (the 4.8 MB of images) was given back.
    setup, trace = _trace("PatchEmbeddingEncoder", trace_validation, (3, 224, 224), 8)
    assert _workspace_at_peak(trace) == 0
    plan = MemoryPlanner._phase_plan(VAL, 8, setup, trace)
    assert plan.workspace == T4.cublas_workspace_bytes()  # no cuDNN allowance beside cuBLAS
    assert plan.overhead < T4.cuda_context_bytes() + 64 * MIB


def test_a_convolution_at_the_peak_holds_its_workspace_there():
    # 32 channels x 49 taps per output position: the lowering (25.7 MB per image) dwarfs the
    # activations, so the training step peaks inside the convolution, workspace included.
    batch = 4
    _, trace = _trace("WideKernelConv", trace_training, (32, 64, 64), batch)
    lowering = batch * 64 * 64 * 32 * 7 * 7 * 4
    assert _workspace_at_peak(trace) == round_allocation(lowering)
    assert trace.max_allocated_bytes > trace.peak_bytes
    assert not any(holder.kind == WORKSPACE for holder in trace.holders)


def test_the_workspace_raises_max_allocated_but_not_the_peak_a_budget_must_hold():
    # Conv_v8.cpp `try_configs`: an engine whose workspace cannot be allocated is skipped for
    # the next one, so the run never fails for it; the plan's fit stays with the rest.
    setup, trace = _trace("WideKernelConv", trace_training, (32, 64, 64), 4)
    plan = MemoryPlanner._phase_plan(TRAIN, 4, setup, trace)
    assert plan.max_allocated_bound == trace.max_allocated_bytes + plan.workspace
    assert plan.predicted_max_allocated == trace.peak_bytes + plan.workspace
    assert plan.allocated_peak == trace.peak_bytes < trace.max_allocated_bytes


def test_the_workspace_follows_the_ops_dtype():
    # Under 16-mixed autocast the convolution runs in fp16: half the lowering's bytes.
    batch = 4
    _, fp32 = _trace("WideKernelConv", trace_training, (32, 64, 64), batch)
    _, fp16 = _trace("WideKernelConv", trace_training, (32, 64, 64), batch, "16-mixed")
    assert _workspace_at_peak(fp16) * 2 == _workspace_at_peak(fp32)
