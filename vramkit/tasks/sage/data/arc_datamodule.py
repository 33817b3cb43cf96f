"""What the ARC datamodules share: ``data.*`` validation, the examples and the loaders."""

from __future__ import annotations

import abc
from typing import Any

import lightning as L
from pydantic import Field
from torch.utils.data import DataLoader

from vramkit.core.data.loaders import LoaderSettings
from vramkit.tasks.sage.data.arc_batching import grid_loader
from vramkit.tasks.sage.data.arc_data import ArcDataSettings, load_examples
from vramkit.tasks.sage.data.arc_examples import ArcExample


class ArcDataModuleSettings(ArcDataSettings, LoaderSettings):
    """The ``data.*`` keys of an ARC datamodule: the data settings plus how they are loaded."""

    batch_size: int = Field(16, gt=0)
    """Training sequences per step and device."""
    val_batch_size: int = Field(16, gt=0)
    """Validation sequences per step and device."""

    def data_settings(self) -> ArcDataSettings:
        """The settings the examples depend on (what the feature cache fingerprints)."""
        return ArcDataSettings(
            **{name: getattr(self, name) for name in ArcDataSettings.model_fields}
        )


class ArcDataModule(L.LightningDataModule, abc.ABC):
    """Training examples of ``train_set`` and validation examples (test pairs) of ``val_set``.

    Subclasses make the datasets (``_make_datasets``); batches are padded to their longest
    sequence and grouped by length. The validation loader is also the test loader: ARC's
    evaluation tasks serve both.

    Its keys are the fields of its ``settings_class`` (`ArcDataModuleSettings`, or a subclass's
    extension of it), given as keyword arguments and kept validated in ``self.settings``; the
    examples depend on ``self.data_settings`` alone (see `vramkit.core.config.settings`).
    """

    settings_class: type[ArcDataModuleSettings] = ArcDataModuleSettings

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.settings = self.settings_class.for_component(type(self), settings)
        self.data_settings = self.settings.data_settings()
        self.train_examples: list[ArcExample] | None = None
        self.val_examples: list[ArcExample] | None = None
        self.train_dataset = None
        self.val_dataset = None

    def load_examples(self) -> None:
        """Read the ARC sets (once): split by task, overlap rules enforced."""
        if self.train_examples is None:
            self.train_examples, self.val_examples = load_examples(self.data_settings)

    def setup(self, stage: str | None = None) -> None:
        self.load_examples()
        if self.val_dataset is None:
            self._make_datasets()

    @abc.abstractmethod
    def _make_datasets(self) -> None:
        """Build ``train_dataset`` and ``val_dataset`` from the loaded examples."""

    def _loader(self, dataset, batch_size: int, *, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        return grid_loader(
            dataset,
            dataset.lengths,
            batch_size,
            shuffle=train,
            num_workers=self.settings.num_workers,
            pin_memory=self.settings.pin_memory,
            persistent_workers=self.settings.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, self.settings.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.settings.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
