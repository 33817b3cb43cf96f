"""The hf_models task: Hugging Face models from a config name (GPT-2, BERT, ViT at tiny sizes),
random data, a real training step with OOM recovery, and a memory plan through Hydra."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from vramkit.tasks.hf_models.configs import build_config
from vramkit.tasks.hf_models.data import RandomImageDataModule, RandomTokenDataModule
from vramkit.tasks.hf_models.module import HFModelModule

TINY_GPT2 = {
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 2,
    "n_positions": 64,
    "vocab_size": 128,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}
TINY_BERT = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
TINY_VIT = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "image_size": 32,
    "patch_size": 8,
}
ADAMW = torch.optim.AdamW
PLAN_MEMORY = Path(__file__).resolve().parents[3] / "scripts" / "plan_memory.py"


def _batch(datamodule, size: int) -> dict[str, torch.Tensor]:
    datamodule.setup("fit")
    return next(iter(datamodule.train_dataloader())) if size else {}


def _tokens(task: str, size: int = 4, **options) -> dict[str, torch.Tensor]:
    datamodule = RandomTokenDataModule(
        task=task,
        seq_len=16,
        vocab_size=128,
        batch_size=size,
        val_batch_size=size,
        train_size=size,
        val_size=size,
        **options,
    )
    return _batch(datamodule, size)


def test_config_names_map_to_builtin_configs_with_published_fields() -> None:
    gpt2 = build_config("gpt2")
    assert (gpt2.model_type, gpt2.n_layer, gpt2.n_embd) == ("gpt2", 12, 768)
    large = build_config("google-bert/bert-large-uncased")
    assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size) == (24, 1024, 4096)
    assert build_config("opt-350m").word_embed_proj_dim == 512
    assert build_config("llama", {"num_hidden_layers": 3}).num_hidden_layers == 3  # a model type
    assert build_config("gpt2", {"n_layer": 3}).n_layer == 3


def test_an_unknown_name_or_field_is_an_error_that_helps() -> None:
    with pytest.raises(ValueError, match="did you mean n_layer"):
        build_config("gpt2", {"n_layers": 3})
    with pytest.raises(ValueError, match="neither a listed checkpoint"):
        build_config("gpt-2-small")


def test_a_misspelt_name_suggests_each_close_name_once() -> None:
    # gpt2 is both a listed checkpoint and a transformers model type.
    with pytest.raises(ValueError, match=r"\(close: ([^)]*)\)") as refused:
        build_config("gtp2")
    close = re.search(r"\(close: ([^)]*)\)", str(refused.value)).group(1).split(", ")
    assert "gpt2" in close
    assert len(close) == len(set(close)), close


def test_random_tokens_have_the_labels_of_each_task() -> None:
    causal = _tokens("causal_lm")
    assert causal["input_ids"].shape == (4, 16) and torch.equal(
        causal["labels"], causal["input_ids"]
    )
    assert bool((causal["input_ids"] >= 1).all()) and bool((causal["attention_mask"] == 1).all())
    masked = _tokens("masked_lm", mlm_probability=0.5)
    assert bool(((masked["labels"] == -100) | (masked["labels"] == masked["input_ids"])).all())
    classes = _tokens("seq_cls", num_labels=3)
    assert classes["labels"].shape == (4,) and int(classes["labels"].max()) < 3
    again = _tokens("causal_lm")
    assert torch.equal(
        torch.sort(again["input_ids"], dim=0).values, torch.sort(causal["input_ids"], dim=0).values
    )  # a pure function of the seed and the index (the loader shuffles the order)


@pytest.mark.parametrize(
    ("task", "config", "overrides", "num_labels"),
    [
        ("causal_lm", "gpt2", TINY_GPT2, None),
        ("masked_lm", "bert-base-uncased", TINY_BERT, None),
        ("seq_cls", "bert-base-uncased", TINY_BERT, 3),
        ("seq_cls", "gpt2", TINY_GPT2, 2),  # a decoder classifier gets a padding id
    ],
)
def test_token_tasks_give_a_finite_loss(task, config, overrides, num_labels) -> None:
    module = HFModelModule(
        task=task, config=config, config_overrides=overrides, num_labels=num_labels, optimizer=ADAMW
    )
    batch = _tokens(task, num_labels=num_labels or 2)
    loss = module(batch).loss
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None for p in module.parameters())


def test_vit_image_classification_and_logits_sum_loss() -> None:
    module = HFModelModule(
        task="image_cls",
        config="vit-base-patch16-224",
        config_overrides=TINY_VIT,
        num_labels=5,
        loss="logits_sum",
        optimizer=ADAMW,
    )
    datamodule = RandomImageDataModule(
        image_size=32, num_labels=5, batch_size=2, val_batch_size=2, train_size=2, val_size=2
    )
    batch = _batch(datamodule, 2)
    assert batch["pixel_values"].shape == (2, 3, 32, 32)
    output = module(batch)
    assert output.logits.shape == (2, 5) and output.loss is None  # no labels passed


def test_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError, match=r"model\.task"):
        HFModelModule(task="translation", config="gpt2", optimizer=ADAMW)
    with pytest.raises(ValueError, match="num_labels is needed"):
        HFModelModule(task="seq_cls", config="gpt2", config_overrides=TINY_GPT2, optimizer=ADAMW)
    with pytest.raises(ValueError, match=r"model\.loss"):
        HFModelModule(task="causal_lm", config="gpt2", loss="mse", optimizer=ADAMW)
    with pytest.raises(ValueError, match=r"data\.task"):
        RandomTokenDataModule(
            task="image_cls", seq_len=4, batch_size=1, val_batch_size=1, train_size=1, val_size=1
        )


def test_a_split_training_step_equals_the_whole_one(oom_rehearsal) -> None:
    # The module inherits the OOM recovery: an injected OOM above 2 samples splits the batch of 4
    # and the accumulated gradients are the whole batch's.
    def make():
        torch.manual_seed(0)
        return HFModelModule(
            task="causal_lm", config="gpt2", config_overrides=TINY_GPT2, optimizer=ADAMW
        )

    batch = _tokens("causal_lm")
    reference, _ = oom_rehearsal.step_gradients(make, batch)
    recovered, module = oom_rehearsal.step_gradients(make, batch, train_above=2)
    oom_rehearsal.assert_same_gradients(recovered, reference, rtol=1e-5)
    assert module.oom_state.train_micro_batch == 2


def test_a_tiny_gpt2_is_planned_from_the_command_line(capsys) -> None:
    spec = importlib.util.spec_from_file_location("plan_memory_script", PLAN_MEMORY)
    plan_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan_memory)
    status = plan_memory.main(
        [
            "+hw=t4",
            "task=hf_models",
            "model.config=gpt2",
            "model.config_overrides={n_layer:2,n_embd:64,n_head:2,vocab_size:256}",
            "data.seq_len=64",
            "data.vocab_size=256",
            "hw.batch_size=4",
            "hw.val_batch_size=4",
            "--json",
        ]
    )
    plan = json.loads(capsys.readouterr().out)
    assert status == 0 and plan["fits"] is True
    numel = sum(
        p.numel()
        for p in HFModelModule(
            task="causal_lm",
            config="gpt2",
            config_overrides={"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256},
            optimizer=ADAMW,
        ).parameters()
    )
    # fp32 weights (16-mixed keeps them in fp32); the JSON rounds GiB to 3 decimals.
    assert plan["train"]["breakdown"]["parameters"] == pytest.approx(4 * numel / 2**30, abs=6e-4)
