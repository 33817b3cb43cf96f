"""A GPU validation step takes nn.MultiheadAttention's inference fast path: the plan follows it."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.tracing.batches import grow_batch
from vramkit.core.planner.tracing.fake_trace import (
    FakeStepRecorder,
    cuda_semantics,
    trace_training,
    trace_validation,
)
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.subject import build_module, build_optimizer

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
BATCH, LENGTH, WIDTH, HEADS = 4, 256, 32, 4
SCORES = BATCH * HEADS * LENGTH * LENGTH * 4  # one [B, H, T, T] fp32 block (bytes)


def _model(**net):
    return OmegaConf.create(
        {
            "_target_": "planning_models.PaddedEncoder",
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True},
            "width": WIDTH,
            "heads": HEADS,
            **net,
        }
    )


def _trace(trace, precision="32-true", **net):
    setup = RunSetup(precision=precision, device=T4)
    fake_mode = FakeTensorMode()
    module = build_module(_model(**net), setup, fake_mode)
    one = {
        "tokens": torch.randn(1, LENGTH, WIDTH),
        "padding": torch.zeros(1, LENGTH, dtype=torch.bool),
        "label": torch.tensor([3]),
    }
    with cuda_semantics(setup) as (semantics, _), fake_mode:
        batch = grow_batch(one, BATCH)
        optimizer = build_optimizer(module, setup)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        return trace(module, optimizer, batch, recorder, semantics)


def test_masked_validation_materialises_the_attention_scores_twice_over():
    val = _trace(trace_validation)
    # masked_softmax writes a second [B, H, T, T] block before the first is freed
    assert val.breakdown["activations"] >= 2 * SCORES
    assert val.breakdown["activations"] < 2 * SCORES + 4 * BATCH * LENGTH * 4 * WIDTH * 4


def test_mixed_precision_turns_autocast_on_and_the_fast_path_off():
    val = _trace(trace_validation, precision="16-mixed")
    assert val.breakdown["activations"] < SCORES  # efficient SDPA: no [B, H, T, T] block


def test_the_fast_path_is_inference_only():
    # Training runs the Python path (grad enabled) on the memory-efficient kernel: two
    # optimizer steps of this model hold less than validation's two score blocks.
    train = _trace(trace_training, dropout=0.0)
    val = _trace(trace_validation, dropout=0.0)
    assert train.breakdown["activations"] < 2 * SCORES <= val.breakdown["activations"]
