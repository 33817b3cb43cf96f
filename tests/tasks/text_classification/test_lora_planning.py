"""The memory planner counts LoRA as the run holds it: frozen base weights in their storage,
gradients and optimizer state for the adapters and the head only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")
pytest.importorskip("peft", reason="model.lora needs `peft`")

from vramkit.core.config.instantiate import instantiate
from vramkit.core.planner.decisions.task_plan import plan_task
from vramkit.core.planner.tracing.recorder import (
    ACTIVATIONS,
    GRADIENTS,
    OPTIMIZER_STATE,
    PARAMETERS,
)
from vramkit.core.quantization.planned_linear import PlannedQuantizedLinear
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.core.run.settling.resolve_hardware import requested_profile

TINY = ("task=text_classification", "model=tiny_classifier", "data.max_length=16")


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _plan(cfg):
    profile = requested_profile(cfg, conf_dir=cfg.paths.conf_dir).profile
    return plan_task(plan_request(cfg, profile, batch_sizes=(2, 2), with_remedies=False))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_planned_model_states_equal_the_exact_counts(compose_config, lora):
    cfg = compose_config(*TINY, "+hw=cpu", *(["+model/lora=default"] if lora else []))
    allocated = _plan(cfg).train.allocated
    module = instantiate(cfg.model)
    trainable = [p for p in module.parameters() if p.requires_grad]
    assert allocated[PARAMETERS] == _bytes([*module.parameters(), *module.buffers()])
    assert allocated[GRADIENTS] == _bytes(trainable)
    # AdamW: two fp32 moments per trainable element, plus one fp32 step per tensor (on the CPU
    # profile the step tensors are counted where they live, with the rest).
    assert allocated[OPTIMIZER_STATE] == 2 * _bytes(trainable) + 4 * len(trainable)
    frozen = [p for p in module.parameters() if not p.requires_grad]
    assert bool(frozen) == lora


def test_a_4bit_stand_in_holds_what_bitsandbytes_holds():
    bnb = pytest.importorskip("bitsandbytes")
    real = bnb.nn.Linear4bit(96, 64, bias=True, quant_type="nf4")
    real.load_state_dict(torch.nn.Linear(96, 64).state_dict())
    real = real.to("cpu")  # quantizes
    quant_state = real.weight.quant_state
    planned = PlannedQuantizedLinear(96, 64, bias=True, kind="4bit")
    assert planned.weight.shape == real.weight.shape and planned.weight.dtype == torch.uint8
    assert planned.absmax.dtype == quant_state.absmax.dtype == torch.uint8  # double quantization
    assert _bytes(planned.buffers()) == quant_state_bytes(quant_state)


def test_qlora_plans_4bit_base_weights(compose_config):
    pytest.importorskip("bitsandbytes")
    quantized = compose_config(*TINY, "+hw=cpu", "+model/lora=default", "model.lora.quantize=4bit")
    module = instantiate(quantized.model)  # the real QLoRA module, quantized by bitsandbytes
    quant_states = sum(
        quant_state_bytes(m.weight.quant_state)
        for m in module.modules()
        if isinstance(m, bnb_linear4bit())
    )
    real = _bytes([*module.parameters(), *module.buffers()]) + quant_states
    planned = _plan(quantized).train.allocated
    assert planned[PARAMETERS] == real
    assert any(p.dtype == torch.uint8 for p in module.parameters())  # 4-bit packed weights
    assert planned[GRADIENTS] == _bytes(p for p in module.parameters() if p.requires_grad)


def quant_state_bytes(quant_state) -> int:
    """Device bytes of a nested bitsandbytes QuantState (absmax, second-level absmax, codes)."""
    tensors = [quant_state.absmax, quant_state.code, quant_state.offset]
    tensors += [quant_state.state2.absmax, quant_state.state2.code]
    return _bytes(tensors)


def bnb_linear4bit():
    import bitsandbytes

    return bitsandbytes.nn.Linear4bit


def _lora_model_config():
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "_target_": "vramkit.tasks.text_classification.module.TextClassificationModule",
            "num_labels": 2,
            "pad_token_id": 0,
            "hf_config": {
                "model_type": "phi",
                "vocab_size": 64,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 64,
            },
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "fc1"]},
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3},
        }
    )


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_lora_step_traced_on_fake_tensors_allocates_what_a_real_cpu_step_does(lora):
    """What frozen weights save for backward, adapters' grads and AdamW state, op by op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramkit.core.planner.tracing.batches import grow_batch
    from vramkit.core.planner.tracing.fake_trace import (
        FakeStepRecorder,
        cuda_semantics,
        trace_training,
    )
    from vramkit.core.planner.tracing.recorder import StorageRecorder
    from vramkit.core.planner.tracing.run_setup import RunSetup
    from vramkit.core.planner.tracing.subject import build_module, build_optimizer

    setup = RunSetup(precision="32-true", device=None)
    model_cfg = _lora_model_config()
    if not lora:
        model_cfg.lora = None
    batch = {
        "input_ids": torch.randint(1, 64, (4, 12)),
        "attention_mask": torch.ones(4, 12, dtype=torch.long),
        "labels": torch.tensor([0, 1, 0, 1]),
    }
    torch.manual_seed(0)
    module = instantiate(model_cfg)
    recorder = StorageRecorder(keep_timeline=True)
    with cuda_semantics(setup) as (semantics, _):
        real = trace_training(module, build_optimizer(module, setup), batch, recorder, semantics)

    fake_mode = FakeTensorMode()
    fake_module = build_module(lambda: instantiate(model_cfg), setup, fake_mode)
    one = {key: value[:1].clone() for key, value in batch.items()}
    with cuda_semantics(setup) as (semantics, _), fake_mode:
        fake_batch = grow_batch(one, 4)
        optimizer = build_optimizer(fake_module, setup)
        recorder = FakeStepRecorder(scalar_stand_in=48, round_to_device=False, keep_timeline=True)
        fake = trace_training(fake_module, optimizer, fake_batch, recorder, semantics)
    for category in (PARAMETERS, GRADIENTS, OPTIMIZER_STATE):
        assert fake.breakdown[category] == real.breakdown[category], category
    # The Hugging Face classifier's fake trace runs ~30 more small ops than the real one (1% more
    # activation bytes here), with or without LoRA: a gap of the fake trace, not of LoRA.
    assert fake.breakdown[ACTIVATIONS] == pytest.approx(real.breakdown[ACTIVATIONS], rel=0.02)
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.01)
