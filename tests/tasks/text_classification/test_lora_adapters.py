"""model.lora: LoRA / QLoRA adapters on the Hugging Face classifier, trained on this CPU."""

from __future__ import annotations

import functools
import io

import pytest
import torch

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")
pytest.importorskip("peft", reason="model.lora needs `peft`")

from vramkit.core.config.schema import ConfigError
from vramkit.tasks.text_classification.lora_adapters import lora_settings
from vramkit.tasks.text_classification.module import TextClassificationModule

TINY_PHI = {
    "model_type": "phi",
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
}
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "dense"]}


def tiny_module(lora=LORA, optimizer=torch.optim.AdamW, lr=1e-2, **kwargs):
    torch.manual_seed(0)
    return TextClassificationModule(
        num_labels=2,
        pad_token_id=0,
        optimizer=functools.partial(optimizer, lr=lr),
        hf_config=TINY_PHI,
        lora=lora,
        **kwargs,
    )


def separable_batch(size=16, length=8):
    generator = torch.Generator().manual_seed(1)
    labels = torch.arange(size) % 2
    input_ids = torch.randint(3, 64, (size, length), generator=generator)
    input_ids[:, 0] = labels + 1  # the label is in the first token
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "labels": labels,
    }


def train_steps(module, batch, steps):
    optimizer = module.optimizer_factory(params=module.parameters())  # as configure_optimizers
    losses = []
    for _ in range(steps):
        loss = module.training_step(batch, 0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_misspelt_lora_key_names_the_closest_one():
    with pytest.raises(
        ConfigError, match=r"model\.lora\.alpah: unknown key; did you mean model\.lora\.alpha\?"
    ):
        lora_settings({"alpah": 8})
    with pytest.raises(
        ConfigError, match=r"model\.lora\.quantize: '3bit' is not one of 4bit, 8bit"
    ):
        lora_settings({"quantize": "3bit"})


def test_a_target_module_the_model_lacks_names_the_closest_layer():
    with pytest.raises(ConfigError, match=r"'q_prj' is no Linear layer .*did you mean q_proj\?"):
        tiny_module(lora={**LORA, "target_modules": ["q_prj"]})


def test_only_adapters_and_the_head_are_trainable():
    module = tiny_module()
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]
    assert trainable, "LoRA must leave something to train"
    for name in trainable:
        assert "lora_" in name or "score.modules_to_save" in name, name
    assert not any("fc1" in name for name in trainable)  # not a target: no adapter


def test_tiny_lora_with_8bit_adamw_and_checkpointing_trains_on_cpu():
    bnb = pytest.importorskip("bitsandbytes")
    module = tiny_module(optimizer=bnb.optim.AdamW8bit, gradient_checkpointing=True)
    assert module.model.base_model.model.model.gradient_checkpointing
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    losses = train_steps(module, separable_batch(), steps=12)
    assert losses[-1] < 0.7 * losses[0], losses
    for name, param in module.named_parameters():
        changed = not torch.equal(before[name], param.detach())
        assert changed == param.requires_grad or "lora_A" in name, name  # B starts at 0, A moves
        if not param.requires_grad:
            assert not changed, f"frozen base weight {name} changed"


def test_qlora_4bit_stores_the_base_in_4_bits_and_trains_on_cpu():
    pytest.importorskip("bitsandbytes")
    module = tiny_module(lora={**LORA, "quantize": "4bit"})
    q_proj = module.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    assert q_proj.weight.dtype == torch.uint8 and q_proj.weight.numel() == 64 * 64 // 2
    score = module.model.base_model.model.score.modules_to_save["default"]
    assert score.weight.dtype == torch.float32  # the head is never quantized
    losses = train_steps(module, separable_batch(), steps=10)
    assert losses[-1] < losses[0]


def test_a_lora_checkpoint_loads_with_weights_only_and_gives_the_same_logits():
    module = tiny_module()
    train_steps(module, separable_batch(), steps=3)
    buffer = io.BytesIO()
    torch.save({"state_dict": module.state_dict(), "hparams": dict(module.hparams)}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # as Lightning loads a resumed run
    restored = tiny_module(lora=saved["hparams"]["lora"])
    restored.load_state_dict(saved["state_dict"], strict=True)
    batch = separable_batch()
    module.eval()
    restored.eval()
    with torch.no_grad():
        expected = module(batch["input_ids"], batch["attention_mask"])
        got = restored(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(got, expected)
