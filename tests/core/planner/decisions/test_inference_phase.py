"""The inference phase: evaluation on its own, with the parameters and nothing of training."""

from __future__ import annotations

import functools

import torch
from omegaconf import OmegaConf
from planning_models import RandomImageDataModule, TinyConvClassifier

import vramkit
from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.decisions.plan import INFERENCE, VAL, MemoryPlanner
from vramkit.core.planner.tracing.batches import PhaseSamples
from vramkit.core.planner.tracing.recorder import (
    ACTIVATIONS,
    GRADIENTS,
    OPTIMIZER_STATE,
    PARAMETERS,
)
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.run.settling.plan_request_from_config import module_factory

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
BATCH, LENGTH, WIDTH, HEADS = 4, 256, 32, 4
SCORES = BATCH * HEADS * LENGTH * LENGTH * 4  # one [B, H, T, T] fp32 block (bytes)
ADAMW = {"_target_": "torch.optim.AdamW", "_partial_": True}


def _planner(target: str, sample: dict, **model) -> MemoryPlanner:
    config = OmegaConf.create({"_target_": target, "optimizer": ADAMW, **model})
    return MemoryPlanner(module_factory(config), PhaseSamples(sample, sample, None, None))


def _encoder() -> MemoryPlanner:
    sample = {
        "tokens": torch.randn(1, LENGTH, WIDTH),
        "padding": torch.zeros(1, LENGTH, dtype=torch.bool),
        "label": torch.tensor([3]),
    }
    return _planner("planning_models.PaddedEncoder", sample, width=WIDTH, heads=HEADS)


def _tied() -> MemoryPlanner:
    return _planner("planning_models.TiedLanguageModel", {"tokens": torch.zeros(1, 64).long()})


def test_inference_holds_the_parameters_and_no_training_state():
    planner, setup = _encoder(), RunSetup(precision="32-true", device=T4)
    val = planner.measure(VAL, BATCH, setup)
    inference = planner.measure(INFERENCE, BATCH, setup)
    assert inference.allocated[GRADIENTS] == inference.allocated[OPTIMIZER_STATE] == 0
    assert inference.allocated[PARAMETERS] == val.allocated[PARAMETERS] > 0
    training_state = val.allocated[GRADIENTS] + val.allocated[OPTIMIZER_STATE]
    assert val.allocated_peak - inference.allocated_peak == training_state > 0
    assert inference.peak_at == "inference step"


def test_inference_takes_the_gpu_fast_path_as_validation_does():
    # nn.TransformerEncoderLayer's fast path with a padding mask writes two [B, H, T, T] blocks.
    planner, setup = _encoder(), RunSetup(precision="32-true", device=T4)
    inference = planner.measure(INFERENCE, BATCH, setup)
    assert inference.allocated[ACTIVATIONS] >= 2 * SCORES
    assert (
        inference.allocated[ACTIVATIONS]
        == planner.measure(VAL, BATCH, setup).allocated[ACTIVATIONS]
    )


def test_weights_loaded_by_from_pretrained_leave_the_tied_copy_reserved():
    setup = RunSetup(precision="32-true", device=T4)
    moved = _tied().measure(INFERENCE, 2, setup)
    loaded = _tied()
    loaded.tied_loaded_twice = True
    twice = loaded.measure(INFERENCE, 2, setup)
    copy_bytes = 12288 * 512 * 4
    assert twice.predicted_max_allocated == moved.predicted_max_allocated
    assert twice.overhead - moved.overhead >= copy_bytes // 2  # its segment stays reserved


def test_every_plan_has_an_inference_phase_in_the_api_json_and_table():
    batch = {"image": torch.randn(2, 3, 32, 32), "label": torch.tensor([1, 2])}
    model = functools.partial(TinyConvClassifier, functools.partial(torch.optim.AdamW))
    plan = vramkit.plan(model, batch, hw="t4", remedies=False)
    assert plan.inference.searched and plan.inference.fits
    assert plan.inference.breakdown["gradients"] == plan.inference.breakdown["optimizer_state"] == 0
    assert plan.inference.peak_gib < plan.val.peak_gib or plan.inference.batch_size > (
        plan.val.batch_size
    )
    assert plan.to_json()["inference"]["batch_size"] == plan.inference.batch_size
    assert f"inference batch {plan.inference.batch_size}" in plan.table()


def test_the_breakdown_keeps_its_header_on_one_line_when_every_phase_takes_all_samples():
    # The longest labels a plan prints: three phases that hold their whole (4-digit) set.
    data = RandomImageDataModule(32, 32, train_length=4096, val_length=1024)
    model = functools.partial(TinyConvClassifier, functools.partial(torch.optim.AdamW))
    table = vramkit.plan(model, data, hw="a100_40gb", remedies=False).table()
    header = next(line for line in table.splitlines() if line.startswith("┃ GiB"))
    assert "inference batch 1024 (all samples) ┃" in header
