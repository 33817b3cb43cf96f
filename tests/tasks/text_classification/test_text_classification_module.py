"""task=text_classification: local JSONL and tokenizer, a Phi classifier, Phi-1.5's size."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from vramkit.core.optional_dependency import import_optional

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")

from vramkit.core.data.bad_lines import AnnotationError
from vramkit.core.run.train import train
from vramkit.tasks.text_classification.datamodule import TextClassificationDataModule
from vramkit.tasks.text_classification.hf_classifier import build_sequence_classifier
from vramkit.tasks.text_classification.text_jsonl import read_labelled_texts
from vramkit.tasks.text_classification.toy_data import save_word_tokenizer

WORDS = ("good", "bad", "film", "meal")


@pytest.fixture
def user_text_data(tmp_path: Path) -> dict[str, str]:
    """A user's data: JSONL with named labels and one broken line, and a word tokenizer."""
    train = [{"text": "good film", "label": "positive"}, {"text": "bad meal", "label": 0}] * 3
    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps(r) for r in train) + '\n{"text": "meal"}\n', encoding="utf-8"
    )
    (tmp_path / "val.jsonl").write_text(json.dumps(train[0]) + "\n", encoding="utf-8")
    save_word_tokenizer(tmp_path / "tokenizer", WORDS)
    return {
        "train_file": str(tmp_path / "train.jsonl"),
        "val_file": str(tmp_path / "val.jsonl"),
        "tokenizer_dir": str(tmp_path / "tokenizer"),
    }


def test_user_files_are_tokenized_to_fixed_shapes_and_bad_lines_counted(user_text_data):
    datamodule = TextClassificationDataModule(
        **user_text_data, label_names=["negative", "positive"], max_length=6, batch_size=4
    )
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (4, 6)
    assert batch["attention_mask"].sum(dim=1).tolist() == [2, 2, 2, 2]  # two words, then padding
    assert set(batch["labels"].tolist()) <= {0, 1}
    assert datamodule.data_problems() == {"train/bad_lines": 1, "val/bad_lines": 0}
    assert datamodule.vocab_size == len(WORDS) + 2


def test_bad_jsonl_lines_name_the_file_and_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 3}\n', encoding="utf-8")
    with pytest.raises(AnnotationError, match=r"data\.jsonl:3: label 3 is outside \[0, 2\)"):
        read_labelled_texts(path, num_labels=2)
    examples, bad = read_labelled_texts(path, num_labels=2, strict=False)
    assert [e.label for e in examples] == [1] and bad[0].line_number == 3


def test_a_tokenizer_padding_with_another_id_is_refused(user_text_data):
    datamodule = TextClassificationDataModule(**user_text_data, pad_token_id=1)
    with pytest.raises(ValueError, match=r"pads with id 0 .*data\.pad_token_id=0"):
        datamodule.setup("fit")


def test_a_typo_in_the_architecture_is_an_error():
    with pytest.raises(ValueError, match=r"num_hiden_layers.*num_hidden_layers"):
        build_sequence_classifier(
            num_labels=2, pad_token_id=0, hf_config={"model_type": "phi", "num_hiden_layers": 2}
        )


def test_phi15_is_a_1_3b_classifier_with_phi15_shapes(compose_config):
    cfg = compose_config("task=text_classification", "model=phi15", "+hw=cpu")
    with torch.device("meta"):  # the architecture only: no memory, no initialisation cost
        model = build_sequence_classifier(
            num_labels=cfg.data.num_labels,
            pad_token_id=cfg.data.pad_token_id,
            hf_config=dict(cfg.model.hf_config),
        )
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (
        24,
        2048,
        32,
    )
    assert (config.intermediate_size, config.vocab_size) == (8192, 51200)
    assert config.max_position_embeddings == 2048
    assert config.rope_parameters["partial_rotary_factor"] == 0.5
    parameters = sum(p.numel() for p in model.parameters())
    assert 1.30e9 < parameters < 1.33e9  # 1,313,366,016 with two labels


def test_fast_dev_run_of_text_classification(compose_config):
    cfg = compose_config(
        "task=text_classification",
        "+hw=cpu",
        "debug=fdr",
        "data.toy.num_train=16",
        "data.toy.num_val=8",
        "data.max_length=32",
        "hw.batch_size=4",
        "hw.val_batch_size=8",
    )
    accuracy = train(cfg)
    assert 0.0 <= accuracy <= 1.0
    assert (Path(cfg.paths.data_dir) / "text_classification" / "toy_16_8_0").is_dir()


def test_without_transformers_the_message_says_what_to_install(monkeypatch):
    real_import = importlib.import_module

    def no_transformers(name, *args):
        if name == "transformers":
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_transformers)
    with pytest.raises(ImportError, match=r"pip install 'vramkit\[nlp\]'"):
        import_optional("transformers", extra="nlp", purpose="task=text_classification")
