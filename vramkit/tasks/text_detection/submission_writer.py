"""ICDAR 2015 submission files (``res_<name>.txt``) from the detector's predictions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from vramkit.tasks.text_detection.icdar_format import write_detections


class IcdarSubmissionWriter(BasePredictionWriter):
    """Write one ``res_<name>.txt`` per predicted image into ``output_dir`` as batches finish.

    Batches are written as they come, so a large test set never holds every prediction in
    memory; ``python -m vramkit.tasks.text_detection.icdar_eval <gt dir> <output_dir>`` scores
    the folder.
    """

    def __init__(self, output_dir: str | Path) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = Path(output_dir)
        self.written = 0

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.written = 0

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: dict[str, list],
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        for name, boxes, scores in zip(
            prediction["names"], prediction["boxes"], prediction["scores"], strict=True
        ):
            write_detections(self.output_dir / f"res_{name}.txt", boxes, scores)
            self.written += 1

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rank_zero_info(f"wrote {self.written} submission files to {self.output_dir}")
