"""The JSONL + local tokenizer datamodule base: loaders from the loader keys, bad lines kept."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from vramkit.core.data.bad_lines import BadLine
from vramkit.core.data.loaders import LoaderSettings
from vramkit.core.data.tokenized_jsonl import (
    BAD_LINES_SHOWN,
    TokenizedJsonlDataModule,
    load_local_tokenizer,
)


class _Numbers(TokenizedJsonlDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.settings = LoaderSettings(batch_size=3, val_batch_size=2, num_workers=0)

    def setup(self, stage: str | None = None) -> None:
        self.tokenizer = ["a", "b", "c", "d"]
        self.train_dataset = list(range(7))
        self.val_dataset = list(range(5))

    def _collate(self) -> Any:
        return torch.tensor


def test_loaders_take_their_batch_sizes_and_the_subclass_collate() -> None:
    data = _Numbers()
    with pytest.raises(RuntimeError, match="setup"):
        data.train_dataloader()
    data.setup("fit")
    assert data.vocab_size == 4
    assert sorted(torch.cat(list(data.train_dataloader())).tolist()) == list(range(7))
    assert [len(batch) for batch in data.val_dataloader()] == [2, 2, 1]  # in order, not shuffled


def test_bad_lines_are_counted_all_and_named_a_few(caplog: pytest.LogCaptureFixture) -> None:
    data = _Numbers()
    bad = [BadLine(Path("train.jsonl"), line, "not JSON") for line in range(1, 14)]
    with caplog.at_level(logging.WARNING):
        data._keep_bad_lines("train", Path("train.jsonl"), bad)
    assert data.data_problems() == {"train/bad_lines": 13, "val/bad_lines": 0}
    named = [record.message for record in caplog.records if record.message.startswith("skipped")]
    assert len(named) == BAD_LINES_SHOWN
    assert caplog.records[-1].message == "... and 3 more bad lines in train.jsonl"


def test_a_missing_tokenizer_folder_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data\.tokenizer_dir is not a folder"):
        load_local_tokenizer(tmp_path / "absent", purpose="a test")


def test_a_subclass_without_a_collate_cannot_be_built() -> None:
    class _NoCollate(TokenizedJsonlDataModule):
        pass

    with pytest.raises(TypeError, match="_collate"):
        _NoCollate()
