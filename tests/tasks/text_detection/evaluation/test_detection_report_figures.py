"""Text detection draws detections and ground truth on its best, worst and random images."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import numpy as np
import torch
from matplotlib import patheffects
from matplotlib.patches import Polygon

from vramkit.core.report.task_figures import DrawsReportFigures
from vramkit.tasks.text_detection.module import TextDetectionModule
from vramkit.tasks.text_detection.network.dbnet import DBNet
from vramkit.tasks.text_detection.network.loss import DBLoss

SIDE = 64


class _ValImages(L.LightningDataModule):
    """Two batches of 3 uint8 images; image k has k + 1 ground-truth boxes, one of them ###."""

    def val_dataloader(self):
        batches = []
        for first in (0, 3):
            polygons, ignore = [], []
            for k in range(first, first + 3):
                boxes = [
                    np.array(
                        [[4, 4 + 8 * i], [60, 4 + 8 * i], [60, 10 + 8 * i], [4, 10 + 8 * i]], float
                    )
                    for i in range(k + 1)
                ]
                polygons.append([box * 2 for box in boxes])  # originals are twice the size
                ignore.append([i == 0 and k > 0 for i in range(k + 1)])
            batches.append(
                {
                    "image": torch.randint(0, 255, (3, 3, SIDE, SIDE), dtype=torch.uint8),
                    "polygons": polygons,
                    "ignore": ignore,
                    "original_size": torch.tensor([[2 * SIDE, 2 * SIDE]] * 3),
                    "name": [f"img_{k}" for k in range(first, first + 3)],
                }
            )
        return batches


def _detecting_module() -> TextDetectionModule:
    # a high prior makes the untrained network find text everywhere: detections to draw
    return TextDetectionModule(
        DBNet(backbone_width=0.25, inner_channels=16, prob_prior=0.99),
        DBLoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
    )


def test_detections_are_drawn_with_ground_truth_on_best_worst_and_random_images():
    torch.manual_seed(0)
    module = _detecting_module()
    assert isinstance(module, DrawsReportFigures)
    module.eval()
    with torch.no_grad():
        (figure,) = module.report_figures(SimpleNamespace(datamodule=_ValImages()), samples=2)
    assert figure.name == "detections"
    axes = [ax for ax in figure.figure.axes if ax.get_title()]
    kinds = [ax.get_title().split(":")[0] for ax in axes]
    assert kinds == ["best", "best", "worst", "worst", "random", "random"]
    assert "6 images read" in figure.caption
    names = {ax.get_title().split(": ")[1].split("\n")[0] for ax in axes}
    assert len(names) == 6  # no image shown twice
    for ax in axes:
        patches = [p for p in ax.patches if isinstance(p, Polygon)]
        colours = [p.get_edgecolor()[:3] for p in patches]
        image = int(ax.get_title().split("img_")[1].split("\n")[0])
        ground_truth = [c for c in colours if c != (1.0, 0.0, 0.0)]
        assert len(ground_truth) == image + 1
        # drawn at the network's scale: originals are twice the image's size
        assert max(p.get_xy()[:, 0].max() for p in patches) <= SIDE + 1
    assert any(p.get_edgecolor()[:3] == (1.0, 0.0, 0.0) for ax in axes for p in ax.patches), (
        "no detection drawn"
    )


def test_every_outline_has_a_black_halo_and_ground_truth_is_not_green():
    torch.manual_seed(0)
    module = _detecting_module()
    module.eval()
    with torch.no_grad():
        (figure,) = module.report_figures(SimpleNamespace(datamodule=_ValImages()), samples=1)
    patches = [p for ax in figure.figure.axes for p in ax.patches if isinstance(p, Polygon)]
    assert patches
    for patch in patches:
        (halo,) = patch.get_path_effects()
        assert isinstance(halo, patheffects.withStroke)
        red, green, blue = patch.get_edgecolor()[:3]
        assert not (green > 0.6 and red < 0.5 and blue < 0.5), "green outline on green text"


class _OneImage(L.LightningDataModule):
    """A validation set of one image (as the overhead benchmark's)."""

    def val_dataloader(self):
        (batch, _) = _ValImages().val_dataloader()
        return [{key: value[:1] for key, value in batch.items()}]


def test_a_validation_set_of_one_image_is_one_panel_without_empty_ones():
    torch.manual_seed(0)
    module = _detecting_module()
    module.eval()
    with torch.no_grad():
        (figure,) = module.report_figures(SimpleNamespace(datamodule=_OneImage()), samples=3)
    (axes,) = figure.figure.axes  # three columns were made for it, two of them empty
    assert axes.get_title().startswith("best: img_0")
    assert tuple(figure.figure.get_size_inches()) == (3.6, 3.6)
