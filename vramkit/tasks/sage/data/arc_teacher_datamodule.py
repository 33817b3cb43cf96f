"""The teacher's data: ARC examples, freshly augmented at every training access."""

from __future__ import annotations

from vramkit.tasks.sage.data.arc_data import ArcAugmentedDataset
from vramkit.tasks.sage.data.arc_datamodule import ArcDataModule


class ArcTeacherDataModule(ArcDataModule):
    """Training examples get a random dihedral transform and colour permutation (``augment``)
    at every access; validation examples are the original test pairs."""

    def _make_datasets(self) -> None:
        augment = self.settings.augment
        enabled = augment if (augment.dihedral or augment.colours) else None
        self.train_dataset = ArcAugmentedDataset(
            self.train_examples, self.settings.encoding, enabled
        )
        self.val_dataset = ArcAugmentedDataset(self.val_examples, self.settings.encoding, None)
