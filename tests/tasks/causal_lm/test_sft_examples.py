"""Prompt/response pairs become samples whose labels are the response's tokens alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="task=causal_lm needs `transformers`")

from vramkit.core.data.bad_lines import AnnotationError
from vramkit.tasks.causal_lm.datamodule import CausalLMDataModule, TokenWindows
from vramkit.tasks.causal_lm.sft_examples import (
    IGNORE_INDEX,
    PromptResponse,
    read_pairs,
    tokenize_example,
)

CORPUS = Path(__file__).resolve().parents[3] / "corpora" / "instruction_pairs"


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(CORPUS / "tokenizer"))


def test_only_the_response_and_the_end_token_are_labelled(tokenizer):
    pair = PromptResponse("what comes after two ?", "after two comes three .")
    example = tokenize_example(tokenizer, pair, "{prompt}")
    words = tokenizer.convert_ids_to_tokens(example.input_ids)
    assert words == ["<s>", *pair.prompt.split(), *pair.response.split(), "</s>"]
    labelled = [w for w, label in zip(words, example.labels, strict=True) if label != IGNORE_INDEX]
    assert labelled == [*pair.response.split(), "</s>"]
    # A labelled token's label is its own id (the model shifts labels for the next-token loss).
    for token, label in zip(example.input_ids, example.labels, strict=True):
        assert label in (IGNORE_INDEX, token)


def test_the_prompt_format_wraps_the_prompt_and_stays_unlabelled(tokenizer):
    pair = PromptResponse("say sky two times .", "sky sky .")
    plain = tokenize_example(tokenizer, pair, "{prompt}")
    wrapped = tokenize_example(tokenizer, pair, "{prompt} yes ,")
    assert len(wrapped.input_ids) == len(plain.input_ids) + 2
    assert wrapped.labels.count(IGNORE_INDEX) == plain.labels.count(IGNORE_INDEX) + 2


def test_padding_is_masked_and_unlabelled_and_long_examples_are_cut(tokenizer):
    pair = PromptResponse("what is one plus two ?", "one plus two is three .")
    example = tokenize_example(tokenizer, pair, "{prompt}")
    padded = TokenWindows([example], 20, tokenizer.pad_token_id, packed=False)[0]
    n = len(example.input_ids)
    assert padded["attention_mask"].tolist() == [1] * n + [0] * (20 - n)
    assert padded["labels"][n:].eq(IGNORE_INDEX).all()
    assert padded["input_ids"][n:].eq(tokenizer.pad_token_id).all()
    cut = TokenWindows([example], 5, tokenizer.pad_token_id, packed=False)[0]
    assert cut["input_ids"].tolist() == example.input_ids[:5]


def test_packing_joins_examples_into_full_windows(tokenizer):
    pairs = [PromptResponse(f"what comes after {w} ?", "yes .") for w in ("one", "two", "three")]
    examples = [tokenize_example(tokenizer, pair, "{prompt}") for pair in pairs]
    stream = [token for example in examples for token in example.input_ids]
    windows = TokenWindows(examples, 8, tokenizer.pad_token_id, packed=True)
    assert len(windows) == len(stream) // 8
    assert windows[1]["input_ids"].tolist() == stream[8:16]
    assert windows[1]["attention_mask"].eq(1).all()
    labels = [label for example in examples for label in example.labels]
    assert windows[1]["labels"].tolist() == labels[8:16]


def test_a_bad_line_is_skipped_and_counted_or_stops_a_strict_run(tmp_path):
    path = tmp_path / "pairs.jsonl"
    lines = [json.dumps({"prompt": "a", "response": "b"}), "{not json", json.dumps({"prompt": 1})]
    path.write_text("\n".join(lines) + "\n")
    pairs, bad = read_pairs(path, strict=False)
    assert pairs == [PromptResponse("a", "b")]
    assert [problem.line_number for problem in bad] == [2, 3]
    with pytest.raises(AnnotationError, match=r"pairs\.jsonl:2"):
        read_pairs(path, strict=True)


def test_the_shipped_corpus_loads_with_fixed_shapes():
    data = CausalLMDataModule(
        train_file=CORPUS / "train.jsonl",
        val_file=CORPUS / "val.jsonl",
        tokenizer_dir=CORPUS / "tokenizer",
        seq_len=24,
        batch_size=4,
        val_batch_size=8,
    )
    data.setup("fit")
    assert len(data.train_dataset) == 320 and len(data.val_dataset) == 80
    batch = next(iter(data.train_dataloader()))
    assert {key: tuple(value.shape) for key, value in batch.items()} == {
        "input_ids": (4, 24),
        "attention_mask": (4, 24),
        "labels": (4, 24),
    }
    assert data.vocab_size == 80
