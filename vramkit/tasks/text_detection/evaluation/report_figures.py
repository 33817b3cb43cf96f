"""Detections drawn on validation images for the run report: the best, the worst and random ones."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from matplotlib import patheffects
from matplotlib.figure import Figure
from matplotlib.patches import Polygon

from vramkit.core.report.png import set_title
from vramkit.core.report.task_figures import ReportFigure, image_grid_margins
from vramkit.tasks.text_detection.data.device_inputs import to_model_inputs
from vramkit.tasks.text_detection.evaluation.icdar_eval import ImageCounts, match_image

if TYPE_CHECKING:
    import lightning as L
    import torch


class BoxPredictor(Protocol):
    """What the figures use of a detection module (TextDetectionModule is one; it imports this
    file, so this file names what it needs instead of importing it back)."""

    @property
    def device(self) -> torch.device: ...

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any: ...

    def predict_boxes(
        self, batch: dict[str, Any]
    ) -> tuple[list[list[np.ndarray]], list[list[float]]]: ...


IMAGES_READ_PER_KIND = 4
"""Validation images read per picture shown: the best and worst are chosen among them."""


@dataclass(eq=False)  # compared by identity: it holds arrays
class _Scored:
    image: np.ndarray  # (H, W, 3) uint8 RGB as the network saw it
    scale: tuple[float, float]  # (x, y) from original-image px to `image` px
    gt: list[np.ndarray]
    ignore: list[bool]
    boxes: list[np.ndarray]
    counts: ImageCounts
    name: str

    @property
    def hmean(self) -> float:
        p, r = self.counts.precision, self.counts.recall
        return 2 * p * r / (p + r) if p + r else 0.0


GROUND_TRUTH_COLOUR = "#00e5ff"
"""Cyan: far from the red of the detections, and from the green of many text backgrounds."""
OUTLINE_HALO = [patheffects.withStroke(linewidth=3.2, foreground="black")]
"""Every outline is drawn over a black stroke twice its width, so it shows on any background
colour, its own included (matplotlib.patheffects.withStroke: the stroke, then the line)."""


def detection_figures(module: BoxPredictor, trainer: L.Trainer, samples: int) -> list[ReportFigure]:
    """One picture: ``samples`` validation images each with the best, the worst and random
    per-image hmean, ground truth in cyan (``###`` white, dashed) and detections in red, each
    outline on a black halo (:data:`OUTLINE_HALO`).

    Reads at most ``IMAGES_READ_PER_KIND * 3 * samples`` images from the start of the validation
    loader (in its fixed order), so the picture costs a few batches, not a validation epoch.
    """
    datamodule = trainer.datamodule
    if datamodule is None or not hasattr(datamodule, "val_dataloader"):
        return []
    scored = _score_images(module, datamodule, IMAGES_READ_PER_KIND * 3 * samples)
    if not scored:
        return []
    ranked = sorted(scored, key=lambda item: (item.hmean, len(item.gt)))
    # a small validation set is shared fairly between the kinds of row
    per_kind = max(1, min(samples, len(ranked) // 3))
    best = ranked[::-1][:per_kind]
    worst = [item for item in ranked if item not in best][:per_kind]
    rest = [item for item in ranked if item not in best and item not in worst]
    chosen_random = random.Random(0).sample(rest, min(samples, len(rest)))
    rows = [("best", best), ("worst", worst), ("random", chosen_random)]
    rows = [(kind, items) for kind, items in rows if items]
    figure = _draw(rows)
    return [
        ReportFigure(
            name="detections",
            title="Detections on validation images",
            figure=figure,
            caption=(
                f"{len(scored)} images read; rows: best, worst and random per-image hmean. "
                "Cyan: ground truth, white dashed: ### (don't care), red: detections."
            ),
        )
    ]


def _score_images(module: BoxPredictor, datamodule: Any, limit: int) -> list[_Scored]:
    scored: list[_Scored] = []
    for raw in datamodule.val_dataloader():
        if "image" not in raw:
            continue
        pictures = raw["image"]  # (B, 3, H, W) uint8, before the device conversion
        # the loader's own device conversion (and precision cast), then floats for any other
        batch = datamodule.on_after_batch_transfer(
            module.transfer_batch_to_device(raw, module.device, 0), 0
        )
        batch = to_model_inputs(batch)
        all_boxes, _ = module.predict_boxes(batch)
        height, width = pictures.shape[-2:]
        for index, boxes in enumerate(all_boxes):
            gt, ignore = list(raw["polygons"][index]), list(raw["ignore"][index])
            original_h, original_w = (int(v) for v in raw["original_size"][index])
            names = raw.get("name")
            scored.append(
                _Scored(
                    image=pictures[index].permute(1, 2, 0).numpy(),
                    scale=(width / original_w, height / original_h),
                    gt=gt,
                    ignore=ignore,
                    boxes=boxes,
                    counts=match_image(gt, ignore, boxes),
                    name=str(names[index]) if names is not None else f"image {len(scored)}",
                )
            )
            if len(scored) >= limit:
                return scored
    return scored


def _draw(rows: list[tuple[str, list[_Scored]]]) -> Figure:
    # as many columns as the longest row fills: an empty axes costs as much to make as a full one
    columns = max(len(items) for _, items in rows)
    size = (3.6 * columns, 3.6 * len(rows))
    figure = Figure(figsize=size)
    axes = figure.subplots(
        len(rows), columns, squeeze=False, gridspec_kw=image_grid_margins(size, len(rows), columns)
    )
    for row, (kind, items) in enumerate(rows):
        for column in range(columns):
            ax = axes[row][column]
            ax.set_axis_off()
            if column >= len(items):
                continue
            item = items[column]
            ax.imshow(item.image)
            scale = np.asarray(item.scale)
            for polygon, dont_care in zip(item.gt, item.ignore, strict=True):
                ax.add_patch(
                    Polygon(
                        np.asarray(polygon, dtype=float) * scale,
                        fill=False,
                        edgecolor="white" if dont_care else GROUND_TRUTH_COLOUR,
                        linestyle="--" if dont_care else "-",
                        linewidth=1.2,
                        path_effects=OUTLINE_HALO,
                    )
                )
            for box in item.boxes:
                ax.add_patch(
                    Polygon(
                        np.asarray(box, dtype=float) * scale,
                        fill=False,
                        edgecolor="red",
                        linewidth=1.2,
                        path_effects=OUTLINE_HALO,
                    )
                )
            counts = item.counts
            set_title(
                ax,
                f"{kind}: {item.name}\nhmean {item.hmean:.2f} "
                f"({counts.matched}/{counts.gt_care} gt, {counts.det_care} det)",
                fontsize=8,
            )
    return figure


__all__ = ["detection_figures"]
