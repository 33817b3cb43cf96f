"""Counts the inputs a run had to skip, says so at the end of every epoch, and stops a run whose
epoch had no usable input at all (training on nothing would exit 0 with an untrained model)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightning as L

from vramkit.core.data.batches import batch_size_of

log = logging.getLogger(__name__)


class BadInputReport(L.Callback):
    """Sums the ``skipped`` count that the text-detection collate puts in every batch.

    Batches of any other form (lists, tuples, tensors, mappings without ``skipped``) count no
    skipped input. A corrupt image is dropped in the loader worker (which warns with its file
    name); this callback turns those drops, and the malformed annotation lines the datasets
    counted when they were built, into one summary line per epoch and the metrics
    ``data/skipped_<phase>_images``.

    A training or validation pass in which every input was skipped raises `NoUsableInputError`
    before the pass's checkpoints are written (checkpoint callbacks run after this one).
    """

    def __init__(self) -> None:
        self._skipped = {"train": 0, "val": 0}
        self._used = {"train": 0, "val": 0}

    def nothing_to_do(
        self, trainer: L.Trainer, datamodule: L.LightningDataModule | None
    ) -> str | None:
        """Only a datamodule that reports its input problems (``data_problems``, as those whose
        collate drops unreadable inputs do) gives it something to count (see
        ``working_set.py``)."""
        if callable(getattr(datamodule, "data_problems", None)):
            return None
        return "the datamodule reports no input problems (it has no data_problems())"

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        problems = getattr(trainer.datamodule, "data_problems", None)
        if problems is None:
            return
        counts = {name: count for name, count in problems().items() if count}
        if counts:
            log.warning("Input problems found while reading the annotations: %s", counts)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._skipped["train"] = self._used["train"] = 0

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Validation inside fitting follows the training batches it would check point.
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._refuse_if_nothing_used(pl_module, "train")
        self._skipped["val"] = self._used["val"] = 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        self._count(batch, "train")

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        self._count(batch, "val")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._refuse_if_nothing_used(pl_module, "train")
        self._report(pl_module, "train")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._refuse_if_nothing_used(pl_module, "val")
            self._report(pl_module, "val")

    def _count(self, batch: Any, phase: str) -> None:
        self._skipped[phase] += skipped_in(batch)
        self._used[phase] += batch_size_of(batch) or 0

    def _refuse_if_nothing_used(self, pl_module: L.LightningModule, phase: str) -> None:
        skipped, used = self._skipped[phase], self._used[phase]
        if skipped and not used:
            raise NoUsableInputError(
                f"{phase} epoch {pl_module.current_epoch} had no usable input: all {skipped} "
                "images were skipped (the warnings above name each file); fix or replace the "
                "data, nothing was trained on"
            )

    def _report(self, pl_module: L.LightningModule, phase: str) -> None:
        skipped = self._skipped[phase]
        pl_module.log(f"data/skipped_{phase}_images", float(skipped))
        if skipped:
            log.warning(
                "%s epoch %d: skipped %d unreadable image(s); the loader warnings above name them",
                phase,
                pl_module.current_epoch,
                skipped,
            )


class NoUsableInputError(RuntimeError):
    """A training or validation pass found no usable input: every sample was skipped."""


def skipped_in(batch: Any) -> int:
    """The ``skipped`` count of a mapping batch (the text-detection collate's); 0 for any other."""
    return int(batch.get("skipped", 0)) if isinstance(batch, Mapping) else 0
