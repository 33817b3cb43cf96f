"""Oracle on real ICDAR 2015 images: perfect probability maps must score a perfect hmean.

The exact shrink map of the ground truth, taken as the network's probability map, goes through
the standard post-processing (binarise at 0.3, box score >= 0.6, unclip ratio 1.5) and the
ICDAR 2015 evaluation. Any loss of precision or recall is a bug in targets, post-processing or
evaluation, or a mismatch between their pixel conventions.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from vramkit.tasks.text_detection.data.icdar_format import read_ground_truth, write_detections
from vramkit.tasks.text_detection.data.targets import make_targets
from vramkit.tasks.text_detection.evaluation.icdar_eval import (
    evaluate_folders,
    match_image,
    summarize,
)
from vramkit.tasks.text_detection.network.postprocess import (
    PostprocessConfig,
    boxes_from_probability,
)

ORACLE_CONFIG = PostprocessConfig(thresh=0.3, box_thresh=0.6, unclip_ratio=1.5)
CARE_INSTANCES = 12  # the toy set's care quads (see its README)


def _oracle_boxes(gt_path: Path, image_path: Path, size: tuple[int, int] | None):
    """Boxes (original pixels) post-processed from the shrink map made at ``size`` (h, w)."""
    image = cv2.imread(str(image_path), cv2.IMREAD_UNCHANGED)
    assert image is not None, image_path
    height, width = image.shape[:2]
    truth = read_ground_truth(gt_path, strict=True)
    map_height, map_width = size or (height, width)
    scale = np.array([map_width / width, map_height / height])
    targets = make_targets([p * scale for p in truth.polygons], truth.ignore, map_height, map_width)
    boxes, _ = boxes_from_probability(targets.shrink_map, height, width, ORACLE_CONFIG)
    return truth, boxes


@pytest.mark.parametrize("size", [None, (640, 640)], ids=["native", "640x640"])
def test_shrink_map_oracle_scores_perfectly(toy_icdar_dir: Path, size) -> None:
    counts = []
    for gt_path in sorted((toy_icdar_dir / "gt").glob("gt_*.txt")):
        image_path = toy_icdar_dir / "images" / (gt_path.stem[len("gt_") :] + ".jpg")
        truth, boxes = _oracle_boxes(gt_path, image_path, size)
        counts.append(match_image(truth.polygons, truth.ignore, boxes))
    metrics = summarize(counts)
    assert metrics["gt_care"] == CARE_INSTANCES
    assert (metrics["precision"], metrics["recall"], metrics["hmean"]) == (1.0, 1.0, 1.0)


def test_oracle_survives_the_submission_files(toy_icdar_dir: Path, tmp_path: Path) -> None:
    # Submission files hold integer coordinates: rounding must not cost a match either.
    for gt_path in sorted((toy_icdar_dir / "gt").glob("gt_*.txt")):
        name = gt_path.stem[len("gt_") :]
        _, boxes = _oracle_boxes(gt_path, toy_icdar_dir / "images" / f"{name}.jpg", (640, 640))
        if boxes:
            write_detections(tmp_path / f"res_{name}.txt", boxes)
    result = evaluate_folders(toy_icdar_dir / "gt", tmp_path, strict=True)
    assert result["matched"] == result["gt_care"] == result["det_care"] == CARE_INSTANCES
    assert result["hmean"] == 1.0 and result["bad_lines"] == 0
