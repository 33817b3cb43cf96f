"""ICDAR 2015 submission files (``res_<name>.txt``) from the detector's predictions.

The files are what the RRC site's official script accepts as they are, under its default
parameters: integer points, each quad clockwise in image axes (y down), and no confidence column
unless asked for (``with_confidences=True``, for the script's ``CONFIDENCES`` mode, which then
requires it). At the end the folder is also zipped into ``<output_dir>.zip``, the file to upload.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from vramkit.core.io.checkpoint_io import atomic_output, atomic_write_bytes
from vramkit.tasks.text_detection.evaluation.rrc_files import clockwise_sums


def submission_quad(polygon: np.ndarray) -> np.ndarray:
    """(4, 2) int64: the quad rounded to whole px and put in the script's clockwise order.

    The script's test is ``sum((x2 - x1) * (y2 + y1)) <= 0`` on the integer points, so the
    rounding comes first and the order is reversed when the rounded quad fails it.
    """
    quad = np.rint(np.asarray(polygon, dtype=np.float64).reshape(4, 2)).astype(np.int64)
    return quad[::-1].copy() if clockwise_sums(quad[None])[0] > 0 else quad


def submission_lines(
    polygons: Sequence[np.ndarray], scores: Sequence[float] | None = None
) -> list[str]:
    """One ``x1,y1,...,x4,y4`` line per quad, ``,confidence`` appended when ``scores`` given."""
    lines = []
    for index, polygon in enumerate(polygons):
        line = ",".join(str(int(v)) for v in submission_quad(polygon).reshape(-1))
        if scores is not None:
            # The script's confidence pattern is [0-1].?[0-9]*: a plain decimal in [0, 1].
            line += f",{min(max(float(scores[index]), 0.0), 1.0):.4f}"
        lines.append(line)
    return lines


class IcdarSubmissionWriter(BasePredictionWriter):
    """Write one ``res_<name>.txt`` per predicted image into ``output_dir`` as batches finish.

    Batches are written as they come, so a large test set never holds every prediction in
    memory. ``python -m vramkit.tasks.text_detection.evaluation.evaluate GT <output_dir>.zip``
    scores the
    submission with the official protocol.
    """

    def __init__(self, output_dir: str | Path, with_confidences: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = Path(output_dir)
        self.with_confidences = with_confidences
        self.written = 0

    @property
    def zip_path(self) -> Path:
        """The zip of all ``res_*.txt`` files, beside the folder (``<output_dir>.zip``)."""
        return self.output_dir.with_name(self.output_dir.name + ".zip")

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
            lines = submission_lines(boxes, scores if self.with_confidences else None)
            path = self.output_dir / f"res_{name}.txt"
            # whole or absent, so an evaluation stopped by a signal leaves no half-written file
            text = "\n".join(lines) + ("\n" if lines else "")
            atomic_write_bytes(path, text.encode("utf-8"))
            self.written += 1

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            with (
                atomic_output(self.zip_path) as handle,
                zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive,
            ):
                for path in sorted(self.output_dir.glob("res_*.txt")):
                    archive.write(path, arcname=path.name)
        rank_zero_info(
            f"wrote {self.written} submission files to {self.output_dir} and {self.zip_path}"
        )
