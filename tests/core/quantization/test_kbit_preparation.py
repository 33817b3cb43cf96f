"""`prepare_for_kbit_training` leaves the planner's model in the dtypes peft's
`prepare_model_for_kbit_training` leaves a bitsandbytes-quantized one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vramkit.core.quantization.kbit_preparation import prepare_for_kbit_training
from vramkit.core.quantization.planned_linear import PlannedQuantizedLinear, plan_quantized_linears

transformers = pytest.importorskip("transformers")

TINY_LLAMA = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "use_cache": False,
}


def _model() -> nn.Module:
    config = transformers.LlamaConfig(**TINY_LLAMA)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16)


def _block_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """The decoder blocks' Linear layers: what transformers quantizes (not ``lm_head``)."""
    found = []
    for _, parent in model.model.layers.named_modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                found.append((parent, name, child))
    return found


def test_the_planned_model_gets_peft_s_dtypes_and_frozen_parameters():
    peft = pytest.importorskip("peft")
    bnb = pytest.importorskip("bitsandbytes")
    real = _model()
    for parent, name, child in _block_linears(real):
        layer = bnb.nn.Linear4bit(
            child.in_features, child.out_features, bias=False, quant_type="nf4"
        )
        layer.load_state_dict(child.state_dict())
        setattr(parent, name, layer.to("cpu"))
    real.is_loaded_in_4bit = True
    real = peft.prepare_model_for_kbit_training(real, use_gradient_checkpointing=False)

    planned = _model().to("meta")
    plan_quantized_linears(_block_linears(planned), "4bit", compute_dtype=torch.bfloat16)
    cast = prepare_for_kbit_training(planned, gradient_checkpointing=False)

    expected = {name: p.dtype for name, p in real.named_parameters()}
    got = {name: p.dtype for name, p in planned.named_parameters()}
    assert got == expected
    assert got["model.norm.weight"] == torch.float32
    assert got["lm_head.weight"] == torch.float32
    assert cast == sum(p.dtype == torch.float32 for p in planned.parameters())
    assert not any(p.requires_grad for p in planned.parameters())
    assert any(isinstance(m, PlannedQuantizedLinear) for m in planned.modules())


def test_with_gradient_checkpointing_the_embeddings_output_requires_grad():
    model = _model()
    plan_quantized_linears(_block_linears(model), "4bit")
    prepare_for_kbit_training(model, gradient_checkpointing=True)
    embedded = model.get_input_embeddings()(torch.zeros(1, 3, dtype=torch.long))
    assert embedded.requires_grad and embedded.dtype == torch.float32
