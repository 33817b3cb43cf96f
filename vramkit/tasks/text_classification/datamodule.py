"""The LightningDataModule of text classification: JSONL splits and a local tokenizer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from torch.utils.data import Dataset

from vramkit.core.config.settings import ConfigPath
from vramkit.core.data.loaders import LoaderSettings
from vramkit.core.data.tokenized_jsonl import TokenizedJsonlDataModule, load_local_tokenizer
from vramkit.tasks.text_classification.text_jsonl import LabelledText, read_labelled_texts
from vramkit.tasks.text_classification.toy_data import (
    ToyTextConfig,
    ensure_toy_text_classification,
)

log = logging.getLogger(__name__)

_USER_FILES = ("train_file", "val_file", "tokenizer_dir")


class TextClassificationDataSettings(LoaderSettings):
    """The ``data.*`` keys of text classification, as the datamodule takes them."""

    train_file: ConfigPath | None = None
    """Training JSONL; given together with ``val_file`` and ``tokenizer_dir``."""
    val_file: ConfigPath | None = None
    """Validation JSONL."""
    tokenizer_dir: ConfigPath | None = None
    """A local folder ``AutoTokenizer`` loads (nothing is downloaded)."""
    data_root: ConfigPath = Path("data")
    """Where the toy set is written."""
    toy: ToyTextConfig | None = ToyTextConfig()
    """The toy set, used when the three paths are null."""
    num_labels: int = Field(2, ge=1)
    """Classes; a JSONL label is an index in [0, num_labels) or a name of ``label_names``."""
    label_names: list[str] | None = None
    """Class names in index order, ``num_labels`` distinct ones; null for index labels only."""
    pad_token_id: int = Field(0, ge=0)
    """Padding id the model is told about."""
    max_length: int = Field(128, ge=1)
    """Tokens per text: longer texts are cut, shorter ones padded."""
    strict: bool = False
    """True: a malformed JSONL line stops the run; false: it is skipped, named and counted."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """The label names against num_labels, and the three user paths all or none."""
        problems = []
        names = self.label_names
        if names is not None and (len(names) != self.num_labels or len(set(names)) != len(names)):
            problems.append(
                (
                    "label_names",
                    f"expected data.num_labels={self.num_labels} distinct names, got {names}",
                )
            )
        given = [key for key in _USER_FILES if getattr(self, key) is not None]
        if given and len(given) != len(_USER_FILES):
            problems += [
                (
                    key,
                    f"missing: data.{given[0]} is set; give train_file, val_file and "
                    "tokenizer_dir together, or none of them for the toy set",
                )
                for key in _USER_FILES
                if key not in given
            ]
        if not given and self.toy is None:
            problems.append(
                ("toy", "missing: give the toy set, or train_file, val_file and tokenizer_dir")
            )
        return problems


class TextClassificationDataset(Dataset):
    """Examples as ``{"text": str, "label": int}``; tokenized by the loader's collate."""

    def __init__(self, examples: Sequence[LabelledText]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        example = self.examples[index]
        return {"text": example.text, "label": example.label}


class TokenizingCollate:
    """Tokenizes a list of examples into ``input_ids`` and ``attention_mask`` (B, max_length)
    and ``labels`` (B,). Every batch is padded to ``max_length`` tokens: fixed shapes make the
    memory of a step independent of the texts, which is what the memory planner assumes."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer(
            [sample["text"] for sample in samples],
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        return {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": torch.tensor([sample["label"] for sample in samples], dtype=torch.long),
        }


class TextClassificationDataModule(TokenizedJsonlDataModule):
    """Training and validation loaders of labelled texts.

    Either all of ``train_file``, ``val_file`` (JSONL, see
    :func:`~vramkit.tasks.text_classification.text_jsonl.read_labelled_texts`) and ``tokenizer_dir``
    (a local folder ``AutoTokenizer`` loads; nothing is downloaded) are given, or none of them and
    the toy set (``toy``: fields of :class:`ToyTextConfig`) is written under ``data_root``.
    ``pad_token_id`` is the padding id the model is told about: the tokenizer must pad with it,
    or, having no padding token, is given that token (its EOS, for GPT-2-style tokenizers).
    With ``strict`` a bad JSONL line stops the run naming file and line; without, it is
    skipped, named in the log and counted in :meth:`data_problems`.

    Its keys are the fields of `TextClassificationDataSettings`, given as keyword arguments and
    kept validated in ``self.settings``; ``paths`` holds the three files, which the toy set fills
    in.
    """

    settings_class = TextClassificationDataSettings

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.settings = TextClassificationDataSettings.for_component(type(self), settings)
        settings = self.settings
        self.paths = {
            key: getattr(settings, key) for key in _USER_FILES if getattr(settings, key) is not None
        }
        self.toy = None if self.paths else settings.toy

    def prepare_data(self) -> None:
        """Write the toy set when no files are configured."""
        if self.toy is not None:
            ensure_toy_text_classification(self.settings.data_root, self.toy)

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and read the splits; later calls reuse them."""
        if self.toy is not None and not self.paths:
            files = ensure_toy_text_classification(self.settings.data_root, self.toy)
            self.paths = {
                "train_file": files.train_file,
                "val_file": files.val_file,
                "tokenizer_dir": files.tokenizer_dir,
            }
        if self.tokenizer is None:
            self.tokenizer = self._load_tokenizer(self.paths["tokenizer_dir"])
        if self.train_dataset is None and stage in (None, "fit"):
            self.train_dataset = self._read("train", self.paths["train_file"])
        if self.val_dataset is None:
            self.val_dataset = self._read("val", self.paths["val_file"])

    def _collate(self) -> Callable[[list[Any]], Any]:
        return TokenizingCollate(self.tokenizer, self.settings.max_length)

    def _read(self, split: str, path: Path) -> TextClassificationDataset:
        examples, bad = read_labelled_texts(
            path,
            num_labels=self.settings.num_labels,
            label_names=self.settings.label_names,
            strict=self.settings.strict,
        )
        self._keep_bad_lines(split, path, bad)
        if not examples:
            raise ValueError(f"{path}: no examples (data.{split}_file)")
        return TextClassificationDataset(examples)

    def _load_tokenizer(self, folder: Path) -> Any:
        tokenizer = load_local_tokenizer(folder, purpose="task=text_classification")
        pad_token_id = self.settings.pad_token_id
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_token_id)
            log.info(
                "tokenizer %s has no padding token: padding with id %d (%r, data.pad_token_id)",
                folder,
                pad_token_id,
                tokenizer.pad_token,
            )
        elif tokenizer.pad_token_id != pad_token_id:
            raise ValueError(
                f"data.pad_token_id is {pad_token_id} but the tokenizer in {folder} pads "
                f"with id {tokenizer.pad_token_id} ({tokenizer.pad_token!r}): set "
                f"data.pad_token_id={tokenizer.pad_token_id}"
            )
        return tokenizer
