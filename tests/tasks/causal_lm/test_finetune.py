"""full / lora / qlora: what trains, what is stored in 4 bits, and what is refused."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

pytest.importorskip("transformers", reason="task=causal_lm needs `transformers`")
pytest.importorskip("peft", reason="model.finetune=lora needs `peft`")

from vramkit.core.config.schema import ConfigError
from vramkit.core.quantization.planned_linear import PlannedQuantizedLinear
from vramkit.tasks.causal_lm.module import CausalLMModule

TINY_LLAMA = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
LINEARS_PER_BLOCK = 7  # q, k, v, o, gate, up, down


def _module(**options) -> CausalLMModule:
    torch.manual_seed(0)
    return CausalLMModule(
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        config="llama",
        config_overrides=TINY_LLAMA,
        **options,
    )


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(4, 96, (2, 12))
    labels = ids.clone()
    labels[:, :5] = -100  # the prompt
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def test_full_trains_every_weight():
    module = _module(finetune="full")
    assert all(p.requires_grad for p in module.parameters())


def test_lora_trains_only_the_adapters_of_every_linear_layer_but_the_output():
    module = _module(finetune="lora", lora={"r": 4, "target_modules": "all-linear"})
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    assert len(trainable) == 2 * LINEARS_PER_BLOCK * TINY_LLAMA["num_hidden_layers"]
    assert not any("lm_head" in name for name in trainable)
    module(_batch()).backward()
    with_grads = [name for name, p in module.named_parameters() if p.grad is not None]
    assert set(with_grads) == set(trainable)


def test_lora_target_modules_pick_the_layers_and_a_typo_names_the_closest():
    module = _module(finetune="lora", lora={"target_modules": ["q_proj", "v_proj"]})
    adapted = {n.split(".")[-4] for n, p in module.named_parameters() if "lora_A" in n}
    assert adapted == {"q_proj", "v_proj"}
    with pytest.raises(ConfigError, match=r"'q_prj' is no Linear layer .*did you mean q_proj\?"):
        _module(finetune="lora", lora={"target_modules": ["q_prj"]})


def test_a_misspelt_method_names_the_closest():
    with pytest.raises(ConfigError, match=r"model.finetune: 'qlroa' .*did you mean qlora\?"):
        _module(finetune="qlroa")


def test_a_bad_qlora_value_is_refused_before_the_model_is_built():
    with pytest.raises(ConfigError, match=r"model\.qlora\.quant_type"):
        _module(finetune="qlora", qlora={"quant_type": "nf5"})


@pytest.mark.parametrize(("quant_type", "double_quant"), [("nf4", True), ("fp4", False)])
def test_qlora_stores_the_base_linear_layers_in_bitsandbytes_4bit(quant_type, double_quant):
    bnb = pytest.importorskip("bitsandbytes", reason="model.finetune=qlora needs bitsandbytes")
    module = _module(
        finetune="qlora",
        qlora={"quant_type": quant_type, "double_quant": double_quant, "compute_dtype": "float32"},
    )
    quantized = [m for m in module.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == LINEARS_PER_BLOCK * TINY_LLAMA["num_hidden_layers"]
    for layer in quantized:
        assert layer.weight.dtype == torch.uint8
        assert layer.weight.quant_state.quant_type == quant_type
        assert (layer.weight.quant_state.state2 is not None) == double_quant
    output = module.model.get_output_embeddings()
    assert type(output) is nn.Linear and output.weight.dtype == torch.float32
    loss = module(_batch())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in module.parameters() if p.requires_grad)


def test_qlora_on_the_meta_device_gets_the_planners_stand_ins():
    with torch.device("meta"):
        module = _module(finetune="qlora", qlora={"quant_type": "fp4", "double_quant": False})
    stand_ins = [m for m in module.modules() if isinstance(m, PlannedQuantizedLinear)]
    assert len(stand_ins) == LINEARS_PER_BLOCK * TINY_LLAMA["num_hidden_layers"]
    assert {(m.quant_type, m.double_quant, m.compute_dtype) for m in stand_ins} == {
        ("fp4", False, torch.bfloat16)
    }


def test_the_loss_weight_of_a_micro_batch_is_its_count_of_labelled_next_tokens():
    module = _module(finetune="lora")
    batch = _batch()
    assert int(module.micro_batch_weight(batch)) == 2 * (12 - 5)


def test_gradient_checkpointing_recomputes_the_blocks_and_keeps_the_adapters_gradients():
    reference = _module(finetune="lora", lora={"r": 4, "dropout": 0.0})
    checkpointed = _module(
        finetune="lora", lora={"r": 4, "dropout": 0.0}, gradient_checkpointing=True
    )
    checkpointed.load_state_dict(reference.state_dict())
    batch = _batch()
    for module in (reference, checkpointed):
        module.train()
        module(batch).backward()
    assert checkpointed.model.base_model.model.model.gradient_checkpointing
    for (name, p), q in zip(reference.named_parameters(), checkpointed.parameters(), strict=True):
        if p.requires_grad:
            torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_gpt2_conv1d_layers_become_equal_linear_layers_that_lora_and_qlora_see():
    import transformers

    from vramkit.tasks.causal_lm.finetune import conv1d_as_linear

    tiny_gpt2 = {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 64, "n_positions": 32}
    config = transformers.GPT2Config(**tiny_gpt2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (2, 8))
    before = model(input_ids=ids).logits
    assert conv1d_as_linear(model) == 4 * tiny_gpt2["n_layer"]  # c_attn, c_proj, c_fc, mlp c_proj
    torch.testing.assert_close(model(input_ids=ids).logits, before)

    module = CausalLMModule(
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        config="gpt2",
        config_overrides=tiny_gpt2,
        finetune="lora",
        lora={"target_modules": ["c_attn"]},
    )
    adapted = {n.split(".")[-4] for n, p in module.named_parameters() if p.requires_grad}
    assert adapted == {"c_attn"}


def _prepared_qlora_dtypes(device: str) -> dict[str, torch.dtype]:
    from vramkit.tasks.causal_lm.finetune import apply_finetune, lora_settings, qlora_settings
    from vramkit.tasks.causal_lm.lm_builder import build_causal_lm

    with torch.device(device):
        model = build_causal_lm(config="llama", config_overrides=TINY_LLAMA).to(torch.bfloat16)
        model = apply_finetune(
            model, "qlora", lora_settings({"r": 4}), qlora_settings({"compute_dtype": "bfloat16"})
        )
    return {
        name: p.dtype
        for name, p in model.named_parameters()
        if "lora_" not in name and p.dtype != torch.uint8
    }


def test_qlora_prepares_the_model_for_kbit_training_in_the_run_and_in_the_plan_alike():
    # peft's prepare_model_for_kbit_training: norms, embeddings and lm_head of a bf16 model in fp32.
    pytest.importorskip("bitsandbytes", reason="model.finetune=qlora needs bitsandbytes")
    run = _prepared_qlora_dtypes("cpu")
    assert run == _prepared_qlora_dtypes("meta")
    assert run and set(run.values()) == {torch.float32}
    assert any(name.endswith("lm_head.weight") for name in run)
    assert any(name.endswith("model.norm.weight") for name in run)
