"""DBNet text detection as a LightningModule: training loss, ICDAR 2015 validation, predictions."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import OptimizerFactory, ScheduledOptimization
from vramkit.core.report.task_figures import ReportFigure
from vramkit.tasks.text_detection.evaluation.icdar_eval import ImageCounts, match_image, summarize
from vramkit.tasks.text_detection.evaluation.report_figures import detection_figures
from vramkit.tasks.text_detection.network.postprocess import (
    PostprocessConfig,
    boxes_from_probability,
)


class TextDetectionModule(ScheduledOptimization, OOMResilientModule):
    """Trains a DBNet and reports ``val/precision``, ``val/recall`` and ``val/hmean`` every epoch.

    Validation batches carry the original polygons and image sizes: the predicted probability
    map is post-processed into quadrilaterals in original image coordinates and matched with the
    ICDAR 2015 protocol, so ``val/hmean`` is the number the official evaluation would give.
    With ``channels_last`` (the profile's ``hw.channels_last``) the network's weights are NHWC.
    """

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> frozenset[str]:
        """Every metric name a run of this module logs (monitors are checked against it)."""
        losses = ("loss", "loss_prob", "loss_binary", "loss_thresh")
        return frozenset(
            [f"train/{name}" for name in losses] + ["val/precision", "val/recall", "val/hmean"]
        )

    def __init__(
        self,
        net: nn.Module,
        loss: nn.Module,
        optimizer: OptimizerFactory,
        lr_schedule: dict[str, Any] | None = None,
        postprocess: dict[str, Any] | None = None,
        compile: bool = False,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net", "loss", "optimizer"])
        # NHWC weights: with the images in NHWC too (data.channels_last) every convolution runs
        # in it; a state dict loads into either layout (load_state_dict copies values).
        self.net = net.to(memory_format=torch.channels_last) if channels_last else net
        self.loss = loss
        self.init_optimization(optimizer, lr_schedule, compile=compile, network="net")
        self.postprocess = PostprocessConfig(**(postprocess or {}))
        self._val_counts: list[ImageCounts] = []

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.net(images)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor | None:
        if "image" not in batch:
            return None  # every image of the batch was unreadable; BadInputReport counts them
        outputs = self.net(batch["image"])
        losses = self.loss(outputs, batch)
        batch_size = batch["image"].shape[0]
        self.log_dict(
            {f"train/{name}": value.detach() for name, value in losses.items() if name != "loss"},
            batch_size=batch_size,
        )
        self.log("train/loss", losses["loss"].detach(), prog_bar=True, batch_size=batch_size)
        return losses["loss"]

    def on_validation_epoch_start(self) -> None:
        self._val_counts = []

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if "image" not in batch:
            return
        for boxes, polygons, ignore in zip(
            self.predict_boxes(batch)[0], batch["polygons"], batch["ignore"], strict=True
        ):
            self._val_counts.append(match_image(polygons, ignore, boxes))

    def on_validation_epoch_end(self) -> None:
        local = np.array(
            [[c.matched, c.gt_care, c.det_care] for c in self._val_counts], dtype=np.int64
        ).reshape(-1, 3)
        # Sum the counts over processes: ICDAR metrics are micro averages over the whole set.
        totals = self.trainer.strategy.reduce(
            torch.as_tensor(local.sum(axis=0), device=self.device), reduce_op="sum"
        )
        matched, gt_care, det_care = (int(v) for v in totals.tolist())
        metrics = summarize([ImageCounts(matched=matched, gt_care=gt_care, det_care=det_care)])
        self.log("val/precision", metrics["precision"], sync_dist=False)
        self.log("val/recall", metrics["recall"], sync_dist=False)
        self.log("val/hmean", metrics["hmean"], prog_bar=True, sync_dist=False)

    @torch.no_grad()
    def predict_boxes(
        self, batch: dict[str, Any]
    ) -> tuple[list[list[np.ndarray]], list[list[float]]]:
        """Quadrilaterals (4, 2 px, original image coordinates) and scores for every image."""
        probability = self.net(batch["image"])["prob"].float().cpu().numpy()
        all_boxes, all_scores = [], []
        for prob_map, (height, width) in zip(probability, batch["original_size"], strict=True):
            boxes, scores = boxes_from_probability(
                prob_map, int(height), int(width), self.postprocess
            )
            all_boxes.append(boxes)
            all_scores.append(scores)
        return all_boxes, all_scores

    def report_figures(self, trainer: Any, samples: int) -> list[ReportFigure]:
        """Detections on the best, worst and random validation images (for report.html)."""
        return detection_figures(self, trainer, samples)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, list]:
        """Boxes and scores per image, with the image names, for submission files."""
        if "image" not in batch:
            return {"names": [], "boxes": [], "scores": []}
        boxes, scores = self.predict_boxes(batch)
        return {"names": list(batch["name"]), "boxes": boxes, "scores": scores}
