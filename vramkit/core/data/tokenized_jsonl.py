"""The base of datamodules whose splits are JSON Lines files and whose tokenizer is a local folder.

Text classification and causal-LM fine-tuning read their splits the same way: skipped lines are
kept per split and counted (:meth:`TokenizedJsonlDataModule.data_problems`), the loaders are
built from the ``data.*`` loader keys, and the tokenizer loads from a folder without downloads.
What differs (the reader, the dataset, the collate, the padding token) stays in each task.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset

from vramkit.core.data.bad_lines import BadLine
from vramkit.core.data.loaders import LoaderSettings, build_loader
from vramkit.core.optional_dependency import import_optional

log = logging.getLogger(__name__)

BAD_LINES_SHOWN = 10
"""Bad lines named in the log per split; all are counted in ``data_problems``."""


class TokenizedJsonlDataModule(L.LightningDataModule, abc.ABC):
    """Training and validation loaders over two JSONL splits and a local tokenizer.

    A subclass sets ``self.settings`` (its :class:`LoaderSettings` subclass), fills
    ``self.tokenizer``, ``self.train_dataset`` and ``self.val_dataset`` in ``setup``, hands each
    split's skipped lines to :meth:`_keep_bad_lines`, and says how samples become a batch
    (:meth:`_collate`, abstract: a subclass without it cannot be built).
    """

    settings: LoaderSettings

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer: Any = None
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self._bad_lines: dict[str, list[BadLine]] = {"train": [], "val": []}

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer can produce (its vocabulary and added tokens)."""
        if self.tokenizer is None:
            raise RuntimeError("call setup() before vocab_size")
        return len(self.tokenizer)

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise RuntimeError("call setup('fit') before train_dataloader()")
        return self._loader(self.train_dataset, self.settings.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            raise RuntimeError("call setup() before val_dataloader()")
        return self._loader(self.val_dataset, self.settings.val_batch_size, train=False)

    def data_problems(self) -> dict[str, int]:
        """Skipped JSONL lines by ``<split>/bad_lines``."""
        return {f"{split}/bad_lines": len(lines) for split, lines in self._bad_lines.items()}

    @abc.abstractmethod
    def _collate(self) -> Callable[[list[Any]], Any]:
        """How the loaders turn a list of samples into a batch."""

    def _loader(self, dataset: Dataset, batch_size: int, *, train: bool) -> DataLoader:
        return build_loader(
            dataset,
            batch_size=batch_size,
            shuffle=train,
            num_workers=self.settings.num_workers,
            pin_memory=self.settings.pin_memory,
            persistent_workers=self.settings.persistent_workers,
            collate_fn=self._collate(),
        )

    def _keep_bad_lines(self, split: str, path: Path, bad: list[BadLine]) -> None:
        """Keep ``split``'s skipped lines for :meth:`data_problems`; name the first few."""
        self._bad_lines[split] = bad
        for problem in bad[:BAD_LINES_SHOWN]:
            log.warning("skipped %s", problem)
        if len(bad) > BAD_LINES_SHOWN:
            log.warning("... and %d more bad lines in %s", len(bad) - BAD_LINES_SHOWN, path)


def load_local_tokenizer(folder: Path, *, purpose: str) -> Any:
    """``transformers.AutoTokenizer`` from ``folder`` (the ``data.tokenizer_dir`` key), never
    downloading; ``purpose`` names what needs it in the message when transformers is missing."""
    transformers = import_optional("transformers", extra="nlp", purpose=purpose)
    if not folder.is_dir():
        raise FileNotFoundError(f"data.tokenizer_dir is not a folder: {folder}")
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
