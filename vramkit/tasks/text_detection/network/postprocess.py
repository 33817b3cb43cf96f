"""DBNet post-processing: from a text probability map to scored quadrilaterals.

The steps invert the target construction of :mod:`vramkit.tasks.text_detection.data.targets`:
binarise,
trace each connected text kernel, fit a minimum-area box, score it by the mean probability inside,
and grow it back by ``D = A·unclip_ratio/L``. Pixel convention: see
:mod:`vramkit.tasks.text_detection.data.polygon_geometry`; output coordinates are scaled by
``out_size /
map_size`` per axis.

Two choices differ from the reference code: contours are taken with ``RETR_EXTERNAL`` (a hole in
a kernel is not a separate text instance), and when there are more than ``max_candidates``
contours the largest ones are kept rather than the first ones found (small noise specks must not
push real text out).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from vramkit.tasks.text_detection.data.polygon_geometry import (
    fill_polygons,
    min_area_rect,
    offset_polygon,
    order_clockwise,
    polygon_area,
    polygon_perimeter,
)


@dataclass
class PostprocessConfig:
    """Post-processing knobs; sizes are in px of the probability map."""

    thresh: float = 0.3  # probability above which a pixel is text
    box_thresh: float = 0.6  # minimum mean probability inside a candidate box
    unclip_ratio: float = 1.5  # growth distance D = area * ratio / perimeter
    max_candidates: int = 1000  # contours considered per image, largest first
    min_size: float = 3  # boxes with a shorter side are dropped (min_size + 2 after unclip)


def _mean_inside(prob: np.ndarray, quad: np.ndarray) -> float:
    """Mean of ``prob`` over the pixels covered by ``quad``, computed on its bounding crop."""
    height, width = prob.shape
    x_lo = min(max(int(np.floor(quad[:, 0].min())), 0), width - 1)
    x_hi = min(max(int(np.ceil(quad[:, 0].max())), 0), width - 1)
    y_lo = min(max(int(np.floor(quad[:, 1].min())), 0), height - 1)
    y_hi = min(max(int(np.ceil(quad[:, 1].max())), 0), height - 1)
    mask = np.zeros((y_hi - y_lo + 1, x_hi - x_lo + 1), dtype=np.uint8)
    fill_polygons(mask, [quad - (x_lo, y_lo)], 1)
    if not mask.any():
        return 0.0
    return float(cv2.mean(prob[y_lo : y_hi + 1, x_lo : x_hi + 1], mask=mask)[0])


def _largest_contours(contours: tuple[np.ndarray, ...], limit: int) -> list[np.ndarray]:
    if len(contours) <= limit:
        return list(contours)
    areas = np.array([cv2.contourArea(contour) for contour in contours])
    keep = np.sort(np.argsort(-areas, kind="stable")[:limit])
    return [contours[i] for i in keep]


def boxes_from_probability(
    prob_map: np.ndarray,
    out_height: int,
    out_width: int,
    config: PostprocessConfig | None = None,
) -> tuple[list[np.ndarray], list[float]]:
    """Text boxes of one image from its (H, W) probability map with values in [0, 1].

    Returns the boxes as (4, 2) float32 corner arrays in px of the ``out_height`` x ``out_width``
    output image (the original image), clockwise on screen from the top-left corner and clipped
    to the image, and their scores (mean probability inside the box before unclipping).
    """
    config = config or PostprocessConfig()
    prob = np.asarray(prob_map)
    if prob.ndim != 2 or prob.size == 0:
        raise ValueError(f"prob_map must be a non-empty (H, W) array, got shape {prob.shape}")
    if out_height <= 0 or out_width <= 0:
        raise ValueError(f"output size must be positive, got {out_height}x{out_width} px")
    prob = prob.astype(np.float32, copy=False)
    height, width = prob.shape
    scale = np.array([out_width / width, out_height / height])

    bitmap = (prob > config.thresh).astype(np.uint8)
    contours, _ = cv2.findContours(bitmap, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    boxes: list[np.ndarray] = []
    scores: list[float] = []
    for contour in _largest_contours(contours, config.max_candidates):
        points = contour.reshape(-1, 2).astype(np.float64)
        quad, short_side = min_area_rect(points)
        if short_side < config.min_size:
            continue
        score = _mean_inside(prob, quad)
        # Written so that a NaN score (NaN in the map) is dropped too.
        if not score >= config.box_thresh:
            continue
        perimeter = polygon_perimeter(quad)
        if perimeter <= 0:
            continue
        grown = offset_polygon(quad, polygon_area(quad) * config.unclip_ratio / perimeter)
        if not grown:
            continue
        quad, short_side = min_area_rect(np.concatenate(grown))
        if short_side < config.min_size + 2:
            continue
        quad = quad * scale
        quad[:, 0] = np.clip(quad[:, 0], 0, out_width - 1)
        quad[:, 1] = np.clip(quad[:, 1], 0, out_height - 1)
        boxes.append(order_clockwise(quad).astype(np.float32))
        scores.append(score)
    return boxes, scores
