"""The plan explains its peak: the largest tensors grouped by module and kind."""

from __future__ import annotations

from fake_traces import traced_padded_encoder

from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.tracing.fake_trace import (
    trace_training,
    trace_validation,
)
from vramkit.core.planner.tracing.peak_holders import SAVED_ACTIVATION, TEMPORARY, fold_indices

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
BATCH, LENGTH, WIDTH, HEADS, LAYERS = 8, 256, 32, 4, 3
SCORES = BATCH * HEADS * LENGTH * LENGTH * 4  # one [B, H, T, T] fp32 block (bytes)


def _trace(trace):
    return traced_padded_encoder(
        trace,
        device=T4,
        precision="32-true",
        batch=BATCH,
        length=LENGTH,
        width=WIDTH,
        heads=HEADS,
        layers=LAYERS,
    )


def test_repeated_blocks_fold_into_one_row():
    assert fold_indices("encoder.layers.17.self_attn") == "encoder.layers.*.self_attn"
    assert fold_indices("blocks.0") == "blocks.*"
    assert fold_indices("0.conv") == "*.conv"
    assert fold_indices("layer2.conv1") == "layer2.conv1"  # a digit inside a name stays


def test_the_training_peak_is_explained_by_module_and_kind():
    trace = _trace(trace_training)
    holders = trace.holders
    assert [h.bytes for h in holders] == sorted((h.bytes for h in holders), reverse=True)
    assert sum(h.bytes for h in holders) <= trace.peak_bytes
    top = holders[0]
    # On a T4 training attention runs the memory-efficient kernel: what every layer's attention
    # saves (projections, output, log-sum-exp) tops the peak, one row for all three layers.
    assert (top.where, top.kind) == ("encoder.layers.*.self_attn", SAVED_ACTIVATION)
    assert top.tensors % LAYERS == 0
    # Dropout masks are saved as CUDA's 1-byte masks, under the dropout module that made them.
    masks = [
        h for h in holders if h.where.startswith("encoder.layers.*.dropout") and h.dtype == "bool"
    ]
    assert masks
    # What a parameter owns is shown under its module, never as the step's.
    owned = [h for h in holders if h.kind in ("parameters", "gradients", "optimizer_state")]
    assert all(h.where.startswith(("encoder", "head")) for h in owned)


def test_the_validation_peak_names_the_fast_path_attention_scores():
    trace = _trace(trace_validation)
    top = trace.holders[0]
    # The brief's validation OOM, explained: the inference fast path's [B, H, T, T] fp32 scores.
    assert (top.where, top.kind) == ("encoder.layers.*.self_attn", TEMPORARY)
    assert top.largest_shape == (BATCH, HEADS, LENGTH, LENGTH) and top.dtype == "float32"
    assert top.bytes >= 2 * SCORES
    activations = [h for h in trace.holders if h.kind in (SAVED_ACTIVATION, TEMPORARY)]
    assert all(h.kind == TEMPORARY for h in activations), "nothing is saved without grad"
