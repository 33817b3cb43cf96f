"""DBNet training targets: shrink (probability) map, threshold map and their masks.

Follows Liao et al. (AAAI 2020): each text polygon of area A and perimeter L is shrunk by
``D = A·(1 − r²)/L`` (r = ``shrink_ratio``) to give the probability target, and the threshold
target rises from the background value to the top value at the polygon's edges, decaying linearly
over the distance D inside and outside of it. Pixel convention: see
:mod:`vramkit.tasks.text_detection.data.polygon_geometry`.

Choices where the reference code is silent or crashes:

- A polygon whose shrunk version is empty is masked out of ``shrink_mask`` (its centre cannot be
  located); one that splits into several pieces has every piece filled (each is text core).
- Self-intersecting polygons, polygons with |area| < 1 px² or fewer than 3 points, and polygons
  with non-finite coordinates are masked out of ``shrink_mask`` and give no threshold target.
- ``###`` (ignore) polygons give no threshold target either, as in the reference code: nothing
  says their outline is a text border.
- Polygons narrower than ``min_text_size`` are masked out of ``shrink_mask`` but still give a
  threshold target: their border is real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import shapely

from vramkit.tasks.text_detection.data.polygon_geometry import (
    MAX_ABS_COORDINATE_PX,
    fill_polygons,
    min_area_rect,
    offset_polygon,
    polygon_area,
    polygon_perimeter,
)


@dataclass(frozen=True)
class TextTargets:
    """The four DBNet target maps of one image, each (H, W) float32 (views of one block)."""

    shrink_map: np.ndarray  # 1 inside shrunk text polygons, else 0
    shrink_mask: np.ndarray  # 0 where the probability loss must not look (ignored text), else 1
    thresh_map: np.ndarray  # in [thresh_min, thresh_max]; thresh_min far from any text border
    thresh_mask: np.ndarray  # 1 inside the dilated text polygons, where the L1 loss applies

    def as_dict(self) -> dict[str, np.ndarray]:
        """The maps by name, as a data loader returns them."""
        return {
            "shrink_map": self.shrink_map,
            "shrink_mask": self.shrink_mask,
            "thresh_map": self.thresh_map,
            "thresh_mask": self.thresh_mask,
        }


def _draw_border(
    polygon: np.ndarray, distance: float, thresh_map: np.ndarray, low: float, high: float
) -> None:
    """Raise ``thresh_map`` to ``low + (high − low)·(1 − min(dist/distance, 1))``, in place.

    ``dist`` is the exact Euclidean distance (px) from each pixel centre to the nearest edge
    segment. Only the polygon's bounding box grown by ``distance`` and clipped to the image is
    visited: farther pixels would get ``low``, the background value.
    """
    height, width = thresh_map.shape
    x_lo = max(int(np.floor(polygon[:, 0].min() - distance)), 0)
    x_hi = min(int(np.ceil(polygon[:, 0].max() + distance)), width - 1)
    y_lo = max(int(np.floor(polygon[:, 1].min() - distance)), 0)
    y_hi = min(int(np.ceil(polygon[:, 1].max() + distance)), height - 1)
    if x_lo > x_hi or y_lo > y_hi:
        return
    starts = polygon
    ends = np.concatenate((polygon[1:], polygon[:1]))
    lengths = np.hypot(*(ends - starts).T)
    safe = np.where(lengths > 0, lengths, 1.0)
    # Per edge, in the frame of the segment (centre c, unit direction u, half length h), a pixel
    # at along-coordinate a and across-coordinate b lies max(|a| − h, 0) and |b| away from it.
    # Both coordinates are linear in x and y, so each is a sum of two 1-D terms; those are made
    # for all edges at once in float64 (far-away coordinates keep their precision) and only the
    # 2-D work is done per edge, in float32.
    ux = np.where(lengths > 0, (ends[:, 0] - starts[:, 0]) / safe, 1.0)[:, None]
    uy = np.where(lengths > 0, (ends[:, 1] - starts[:, 1]) / safe, 0.0)[:, None]
    dx = np.arange(x_lo, x_hi + 1, dtype=np.float64)[None, :] - 0.5 * (starts[:, :1] + ends[:, :1])
    dy = np.arange(y_lo, y_hi + 1, dtype=np.float64)[None, :] - 0.5 * (starts[:, 1:] + ends[:, 1:])
    along_x, along_y = (dx * ux).astype(np.float32), (dy * uy).astype(np.float32)
    across_x, across_y = (dx * uy).astype(np.float32), (dy * ux).astype(np.float32)
    halves = (0.5 * lengths).astype(np.float32)
    # Pixels at distance >= D get the background value whatever the edge: D² is the start value.
    nearest_sq = np.full((dy.shape[1], dx.shape[1]), distance * distance, dtype=np.float32)
    zeros = np.zeros_like(nearest_sq)
    box_lo = np.floor(np.minimum(starts, ends) - distance).astype(np.int64) - (x_lo, y_lo)
    box_hi = np.ceil(np.maximum(starts, ends) + distance).astype(np.int64) - (x_lo, y_lo)
    for edge in range(len(polygon)):
        # Only pixels within D of the segment can come closer than D: visit the segment's box
        # grown by D, a fraction of the polygon's box for all but the longest edges.
        c0, r0 = max(int(box_lo[edge, 0]), 0), max(int(box_lo[edge, 1]), 0)
        c1 = min(int(box_hi[edge, 0]), x_hi - x_lo)
        r1 = min(int(box_hi[edge, 1]), y_hi - y_lo)
        if c0 > c1 or r0 > r1:
            continue
        columns, rows = slice(c0, c1 + 1), slice(r0, r1 + 1)
        along = np.add(along_x[edge, columns], along_y[edge, rows, None])
        np.abs(along, out=along)
        along -= halves[edge]
        # np.maximum against an array, not a scalar: numpy's scalar path is several times slower.
        np.maximum(along, zeros[: along.shape[0], : along.shape[1]], out=along)
        along *= along
        across = np.subtract(across_x[edge, columns], across_y[edge, rows, None])
        across *= across
        along += across
        window = nearest_sq[rows, columns]
        np.minimum(window, along, out=window)
    value = np.sqrt(nearest_sq, out=nearest_sq)
    value *= np.float32(-(high - low) / distance)
    value += np.float32(high)
    window = thresh_map[y_lo : y_hi + 1, x_lo : x_hi + 1]
    np.maximum(window, value, out=window)


def _checked_polygons(polygons: Sequence[np.ndarray], ignore: Sequence[bool]) -> list[np.ndarray]:
    if len(polygons) != len(ignore):
        raise ValueError(f"{len(polygons)} polygons but {len(ignore)} ignore flags")
    checked = []
    for index, polygon in enumerate(polygons):
        array = np.asarray(polygon, dtype=np.float64)
        if array.size == 0:
            array = array.reshape(0, 2)
        if array.ndim != 2 or array.shape[1] != 2:
            raise ValueError(f"polygon {index} has shape {array.shape}, expected (N, 2)")
        checked.append(array)
    return checked


def _usable_vertices(polygon: np.ndarray) -> np.ndarray:
    return np.isfinite(polygon).all(axis=1) & (np.abs(polygon) < MAX_ABS_COORDINATE_PX).all(axis=1)


def _simple_polygons(polygons: list[np.ndarray], candidates: list[int]) -> set[int]:
    """Indices among ``candidates`` whose polygon does not cross or touch itself."""
    if not candidates:
        return set()
    coords = np.concatenate([polygons[i] for i in candidates])
    ring_ids = np.repeat(np.arange(len(candidates)), [len(polygons[i]) for i in candidates])
    # One vectorised GEOS call for the whole image: per-polygon shapely objects cost more than
    # the rest of the target work for a small polygon.
    rings = shapely.linearrings(coords, indices=ring_ids)
    valid = shapely.is_valid(shapely.polygons(rings))
    return {index for index, ok in zip(candidates, valid, strict=True) if ok}


def make_targets(
    polygons: Sequence[np.ndarray],
    ignore: Sequence[bool],
    height: int,
    width: int,
    *,
    shrink_ratio: float = 0.4,
    thresh_min: float = 0.3,
    thresh_max: float = 0.7,
    min_text_size: float = 8,
) -> TextTargets:
    """Build the DBNet targets of one image of ``height`` x ``width`` px.

    ``polygons`` are (N, 2) vertex arrays in px (image coordinates, may reach outside the image);
    ``ignore[i]`` marks ``###`` regions. ``min_text_size`` (px) is compared with the short side of
    each polygon's minimum-area rectangle. Degenerate polygons never raise (see the module notes);
    a polygon that is not an (N, 2) array, or flags that do not match the polygons, do.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width} px")
    if not 0.0 < shrink_ratio < 1.0:
        raise ValueError(f"shrink_ratio must lie in (0, 1), got {shrink_ratio}")
    checked = _checked_polygons(polygons, ignore)

    # One block for the four maps: a single allocation is markedly cheaper than four.
    shrink_map, shrink_mask, thresh_map, thresh_mask = np.empty(
        (4, height, width), dtype=np.float32
    )
    shrink_map.fill(0.0)
    shrink_mask.fill(1.0)
    thresh_map.fill(thresh_min)
    thresh_mask.fill(0.0)

    areas: dict[int, float] = {}
    for index, polygon in enumerate(checked):
        usable = _usable_vertices(polygon)
        if not usable.all():
            # Where the text is cannot be known; keep the loss off what can still be located.
            fill_polygons(shrink_mask, [polygon[usable]], 0.0)
            continue
        area = polygon_area(polygon) if len(polygon) >= 3 else 0.0
        if area < 1.0:
            fill_polygons(shrink_mask, [polygon], 0.0)
            continue
        areas[index] = area
    simple = _simple_polygons(checked, list(areas))

    shrink_factor = 1.0 - shrink_ratio**2
    for index, area in areas.items():
        polygon = checked[index]
        if index not in simple:
            fill_polygons(shrink_mask, [polygon], 0.0)
            continue
        distance = area * shrink_factor / polygon_perimeter(polygon)

        if not ignore[index]:
            fill_polygons(thresh_mask, offset_polygon(polygon, distance), 1.0)
            _draw_border(polygon, distance, thresh_map, thresh_min, thresh_max)

        if ignore[index] or min_area_rect(polygon)[1] < min_text_size:
            fill_polygons(shrink_mask, [polygon], 0.0)
            continue
        shrunk = offset_polygon(polygon, -distance)
        if not shrunk:
            fill_polygons(shrink_mask, [polygon], 0.0)
            continue
        fill_polygons(shrink_map, shrunk, 1.0)

    return TextTargets(
        shrink_map=shrink_map,
        shrink_mask=shrink_mask,
        thresh_map=thresh_map,
        thresh_mask=thresh_mask,
    )
