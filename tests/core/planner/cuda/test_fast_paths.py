"""A GPU validation step takes nn.MultiheadAttention's inference fast path: the plan follows it."""

from __future__ import annotations

from fake_traces import traced_padded_encoder

from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.tracing.fake_trace import (
    trace_training,
    trace_validation,
)

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
BATCH, LENGTH, WIDTH, HEADS = 4, 256, 32, 4
SCORES = BATCH * HEADS * LENGTH * LENGTH * 4  # one [B, H, T, T] fp32 block (bytes)


def _trace(trace, precision="32-true", **net):
    return traced_padded_encoder(
        trace,
        device=T4,
        precision=precision,
        batch=BATCH,
        length=LENGTH,
        width=WIDTH,
        heads=HEADS,
        **net,
    )


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
