"""The LightningDataModule of causal-LM fine-tuning: prompt/response JSONL and a local tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from torch.utils.data import Dataset

from vramkit.core.config.settings import ConfigPath
from vramkit.core.data.loaders import LoaderSettings
from vramkit.core.data.tokenized_jsonl import TokenizedJsonlDataModule, load_local_tokenizer
from vramkit.tasks.causal_lm.sft_examples import (
    IGNORE_INDEX,
    TokenizedExample,
    read_pairs,
    tokenize_example,
)


class CausalLMDataSettings(LoaderSettings):
    """The ``data.*`` keys of causal-LM fine-tuning, as the datamodule takes them."""

    train_file: ConfigPath = Path("corpora/instruction_pairs/train.jsonl")
    """Training JSONL, one {"prompt", "response"} per line."""
    val_file: ConfigPath = Path("corpora/instruction_pairs/val.jsonl")
    """Validation JSONL."""
    tokenizer_dir: ConfigPath = Path("corpora/instruction_pairs/tokenizer")
    """A local folder AutoTokenizer loads (nothing is downloaded)."""
    prompt_format: str = "{prompt}"
    """How a prompt is written before its response; {prompt} is replaced by it."""
    seq_len: int = Field(32, ge=2)
    """Tokens per sample: longer examples are cut, shorter ones padded (or packed)."""
    packing: bool = False
    """Join the examples into one stream cut into seq_len windows, instead of padding each."""
    strict: bool = False
    """True: a malformed JSONL line stops the run; false: it is skipped, named and counted."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        if "{prompt}" not in self.prompt_format:
            return [("prompt_format", "must contain {prompt}")]
        return []


class TokenWindows(Dataset):
    """Fixed-length samples: ``input_ids``, ``attention_mask`` and ``labels``, each ``seq_len``."""

    def __init__(
        self, examples: Sequence[TokenizedExample], seq_len: int, pad_id: int, *, packed: bool
    ):
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.items = _packed(examples, seq_len) if packed else _padded(examples, seq_len, pad_id)
        if not self.items:
            raise ValueError(
                f"no sample of {seq_len} tokens: the corpus is shorter than one window "
                "(data.seq_len, data.packing)"
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        input_ids, mask, labels = self.items[index]
        return {
            "input_ids": torch.tensor(input_ids, dtype=torch.long),
            "attention_mask": torch.tensor(mask, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
        }


def _padded(examples: Sequence[TokenizedExample], seq_len: int, pad_id: int) -> list[tuple]:
    # Every sample is padded to seq_len: fixed shapes make a step's memory independent of the
    # texts, which is what the memory planner assumes. Padding is masked and has no label.
    items = []
    for example in examples:
        ids, labels = example.input_ids[:seq_len], example.labels[:seq_len]
        pad = seq_len - len(ids)
        items.append(
            (ids + [pad_id] * pad, [1] * len(ids) + [0] * pad, labels + [IGNORE_INDEX] * pad)
        )
    return items


def _packed(examples: Sequence[TokenizedExample], seq_len: int) -> list[tuple]:
    # The examples back to back, cut into windows; the rest that fills no window is dropped (as
    # TRL's ConstantLengthDataset does). Attention crosses example boundaries, as there.
    ids = [token for example in examples for token in example.input_ids]
    labels = [label for example in examples for label in example.labels]
    return [
        (ids[start : start + seq_len], [1] * seq_len, labels[start : start + seq_len])
        for start in range(0, len(ids) - seq_len + 1, seq_len)
    ]


def _stack(samples: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}


class CausalLMDataModule(TokenizedJsonlDataModule):
    """Training and validation loaders of prompt/response pairs for supervised fine-tuning.

    ``train_file`` and ``val_file`` are JSON Lines of ``{"prompt", "response"}``
    (:func:`~vramkit.tasks.causal_lm.sft_examples.read_pairs`), ``tokenizer_dir`` a local folder
    ``AutoTokenizer`` loads. Every sample has ``seq_len`` tokens, padded or packed, and labels
    -100 on the prompt and the padding. Its keys are the fields of `CausalLMDataSettings`.
    """

    settings_class = CausalLMDataSettings

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.settings = CausalLMDataSettings.for_component(type(self), settings)

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and tokenize the splits; later calls reuse them."""
        if self.tokenizer is None:
            self.tokenizer = self._load_tokenizer(self.settings.tokenizer_dir)
        if self.train_dataset is None and stage in (None, "fit"):
            self.train_dataset = self._read("train", self.settings.train_file)
        if self.val_dataset is None:
            self.val_dataset = self._read("val", self.settings.val_file)

    def _collate(self) -> Callable[[list[Any]], Any]:
        return _stack

    def _read(self, split: str, path: Path) -> TokenWindows:
        pairs, bad = read_pairs(path, strict=self.settings.strict)
        self._keep_bad_lines(split, path, bad)
        if not pairs:
            raise ValueError(f"{path}: no prompt/response pairs (data.{split}_file)")
        examples = [tokenize_example(self.tokenizer, p, self.settings.prompt_format) for p in pairs]
        return TokenWindows(
            examples,
            self.settings.seq_len,
            self.tokenizer.pad_token_id,
            packed=self.settings.packing,
        )

    def _load_tokenizer(self, folder: Path) -> Any:
        tokenizer = load_local_tokenizer(folder, purpose="task=causal_lm")
        if tokenizer.pad_token_id is None:
            # Llama-style tokenizers have no padding token; padding is masked and unlabelled,
            # so any id serves: the end token, as most fine-tuning recipes do.
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
