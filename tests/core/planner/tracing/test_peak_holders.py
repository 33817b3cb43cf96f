"""The plan explains its peak: the largest tensors grouped by module and kind."""

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
from vramkit.core.planner.tracing.peak_holders import SAVED_ACTIVATION, TEMPORARY, fold_indices
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.subject import build_module, build_optimizer

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
BATCH, LENGTH, WIDTH, HEADS, LAYERS = 8, 256, 32, 4, 3
SCORES = BATCH * HEADS * LENGTH * LENGTH * 4  # one [B, H, T, T] fp32 block (bytes)


def _trace(trace):
    setup = RunSetup(precision="32-true", device=T4)
    fake_mode = FakeTensorMode()
    model = OmegaConf.create(
        {
            "_target_": "planning_models.PaddedEncoder",
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True},
            "width": WIDTH,
            "heads": HEADS,
            "layers": LAYERS,
        }
    )
    module = build_module(model, setup, fake_mode)
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
