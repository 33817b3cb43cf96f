"""DBNet post-processing: the shrunk text kernel comes back as the original box."""

from __future__ import annotations

import numpy as np
import pytest
import shapely

from vramkit.tasks.text_detection.data.polygon_geometry import fill_polygons
from vramkit.tasks.text_detection.data.targets import make_targets
from vramkit.tasks.text_detection.network.postprocess import (
    PostprocessConfig,
    boxes_from_probability,
)


def _rotated_rectangle(centre, width, height, angle) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [width / 2, height / 2]
    return corners @ np.array([[c, s], [-s, c]]) + centre


def _iou(first: np.ndarray, second: np.ndarray) -> float:
    a, b = shapely.Polygon(first), shapely.Polygon(second)
    return a.intersection(b).area / a.union(b).area


def _blob_map(shape, polygons, value=1.0) -> np.ndarray:
    prob = np.zeros(shape, dtype=np.float32)
    for polygon in polygons:
        fill_polygons(prob, [np.asarray(polygon, dtype=np.float64)], value)
    return prob


@pytest.mark.parametrize("angle", [0.0, 0.3, -0.6])
def test_shrunk_kernel_unclips_back_to_the_text_box(angle: float) -> None:
    quad = _rotated_rectangle((200, 150), 120, 80, angle)
    prob = make_targets([quad], [False], 300, 400).shrink_map
    boxes, scores = boxes_from_probability(prob, 300, 400, PostprocessConfig())
    assert len(boxes) == 1
    assert scores[0] > 0.9
    assert boxes[0].shape == (4, 2) and boxes[0].dtype == np.float32
    assert _iou(boxes[0], quad) > 0.9


def test_boxes_are_scaled_to_the_output_size() -> None:
    quad = _rotated_rectangle((200, 150), 120, 80, 0.2)
    prob = make_targets([quad], [False], 300, 400).shrink_map
    boxes, _ = boxes_from_probability(prob, 600, 1200)
    assert len(boxes) == 1
    assert _iou(boxes[0], quad * [3.0, 2.0]) > 0.9


def test_corners_go_clockwise_from_the_top_left() -> None:
    prob = _blob_map((300, 400), [_rotated_rectangle((200, 150), 150, 60, 0.4)])
    (box,), _ = boxes_from_probability(prob, 300, 400)
    assert np.argmin(box.sum(axis=1)) == 0
    x, y = box[:, 0].astype(np.float64), box[:, 1].astype(np.float64)
    # Positive shoelace sum in image axes (y down) means clockwise on screen.
    assert np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)) > 0


def test_low_scoring_regions_are_dropped() -> None:
    prob = _blob_map((200, 200), [_rotated_rectangle((100, 100), 80, 40, 0.0)], value=0.5)
    assert boxes_from_probability(prob, 200, 200, PostprocessConfig(box_thresh=0.6))[0] == []
    boxes, scores = boxes_from_probability(prob, 200, 200, PostprocessConfig(box_thresh=0.4))
    assert len(boxes) == 1 and scores[0] == pytest.approx(0.5)


def test_specks_below_the_minimum_size_are_dropped() -> None:
    prob = np.zeros((100, 100), dtype=np.float32)
    prob[10:12, 10:40] = 1.0  # 2 rows: short side 1 px between pixel centres
    prob[50:70, 50:80] = 1.0
    boxes, _ = boxes_from_probability(prob, 100, 100)
    assert len(boxes) == 1
    assert boxes[0][:, 1].min() > 40


def test_max_candidates_keeps_the_largest_regions() -> None:
    prob = np.zeros((200, 400), dtype=np.float32)
    sizes = [10, 40, 20, 30]
    for index, size in enumerate(sizes):
        prob[50 : 50 + size, 20 + 90 * index : 20 + 90 * index + size] = 1.0
    boxes, _ = boxes_from_probability(prob, 200, 400, PostprocessConfig(max_candidates=2))
    assert len(boxes) == 2
    lefts = sorted(float(box[:, 0].min()) for box in boxes)
    assert lefts[0] < 110 < lefts[1] < 290  # the 40 px and 30 px squares, not the others


def test_boxes_near_the_border_are_clipped_to_the_image() -> None:
    prob = np.zeros((100, 200), dtype=np.float32)
    prob[0:30, 0:60] = 1.0
    (box,), _ = boxes_from_probability(prob, 100, 200)
    assert box.min() >= 0.0
    assert box[:, 0].max() <= 199 and box[:, 1].max() <= 99


def test_empty_and_nan_maps_give_no_boxes() -> None:
    assert boxes_from_probability(np.zeros((64, 64)), 64, 64) == ([], [])
    prob = np.full((64, 64), np.nan, dtype=np.float32)
    prob[10:40, 10:40] = 1.0
    prob[20, 20] = np.nan  # a NaN inside the box makes its mean NaN: dropped, not kept
    assert boxes_from_probability(prob, 64, 64) == ([], [])


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="prob_map"):
        boxes_from_probability(np.zeros((1, 64, 64)), 64, 64)
    with pytest.raises(ValueError, match="output size"):
        boxes_from_probability(np.zeros((64, 64)), 0, 64)
