"""Polygon geometry shared by DBNet targets, post-processing and the ICDAR 2015 evaluation.

Conventions: coordinates are image pixels, x to the right and y down, and pixel (row i, column j)
is centred at (x=j, y=i). That is the convention of ``cv2.fillPoly`` (which fills the pixels on or
inside the polygon, its vertices rounded to pixel centres) and of ``cv2.findContours`` (which
traces the centres of the boundary pixels), so a polygon drawn by :func:`fill_polygons` and
traced back keeps its size in px.
"""

from __future__ import annotations

import cv2
import numpy as np
import pyclipper

# pyclipper works on integers; coordinates are scaled by this factor for 1/256 px precision, which
# is also the fixed-point format cv2.fillPoly reads with ``shift=FILL_SHIFT``.
CLIPPER_SCALE = 256
FILL_SHIFT = 8
# Round joins are flattened into segments that stay within this distance (px) of the true arc:
# fine enough for targets, coarse enough to keep a dilated box at a few dozen vertices. For huge
# offsets the tolerance grows with the offset, so a corner never becomes thousands of vertices.
ARC_TOLERANCE_PX = 0.05
ARC_TOLERANCE_RELATIVE = 1e-3
# Beyond this magnitude (px) a coordinate is garbage, not geometry; it would also overflow the
# fixed-point formats above.
MAX_ABS_COORDINATE_PX = 1e9
# Filled paths are clipped to the canvas grown by this margin (px) so they fit cv2's int32 format.
_FILL_MARGIN_PX = 4


def polygon_area(points: np.ndarray) -> float:
    """Absolute shoelace area (px²) of a closed polygon given as (N, 2) vertices."""
    x, y = points[:, 0], points[:, 1]
    twice_signed = np.dot(x[:-1], y[1:]) - np.dot(y[:-1], x[1:]) + x[-1] * y[0] - y[-1] * x[0]
    return 0.5 * abs(float(twice_signed))


def polygon_perimeter(points: np.ndarray) -> float:
    """Perimeter (px) of a closed polygon given as (N, 2) vertices."""
    edges = np.concatenate((points[1:], points[:1])) - points
    return float(np.hypot(edges[:, 0], edges[:, 1]).sum())


def _to_clipper(points: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(points, dtype=np.float64) * CLIPPER_SCALE).astype(np.int64)


def offset_polygon(points: np.ndarray, distance: float) -> list[np.ndarray]:
    """Offset a polygon by ``distance`` px (positive grows, negative shrinks) with round joins.

    Returns every resulting path as a (M, 2) float64 array in px: none when the polygon vanishes,
    several when shrinking splits it, an outer path plus holes when growing closes a gap.
    """
    offset = pyclipper.PyclipperOffset()
    tolerance = max(ARC_TOLERANCE_PX, ARC_TOLERANCE_RELATIVE * abs(float(distance)))
    offset.ArcTolerance = tolerance * CLIPPER_SCALE
    offset.AddPath(_to_clipper(points).tolist(), pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    paths = offset.Execute(float(distance) * CLIPPER_SCALE)
    return [np.asarray(path, dtype=np.float64) / CLIPPER_SCALE for path in paths if len(path) >= 3]


def _clip_fixed_point_paths(
    paths: list[np.ndarray], window: tuple[int, int, int, int]
) -> list[np.ndarray]:
    x0, y0, x1, y1 = window
    clipper = pyclipper.Pyclipper()
    clipper.AddPath([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], pyclipper.PT_CLIP, True)
    for path in paths:
        try:
            clipper.AddPath(path.tolist(), pyclipper.PT_SUBJECT, True)
        except pyclipper.ClipperException:
            # A path without area is refused as a polygon; clipped as a closed polyline it still
            # yields the line that cv2.fillPoly would have drawn for it.
            outline = np.concatenate((path, path[:1]))
            if len(np.unique(outline, axis=0)) >= 2:
                clipper.AddPath(outline.tolist(), pyclipper.PT_SUBJECT, False)
    try:
        tree = clipper.Execute2(
            pyclipper.CT_INTERSECTION, pyclipper.PFT_EVENODD, pyclipper.PFT_EVENODD
        )
    except pyclipper.ClipperException:
        return []  # no subject path at all
    return [np.asarray(path, dtype=np.int64) for path in pyclipper.PolyTreeToPaths(tree)]


def fill_polygons(canvas: np.ndarray, polygons: list[np.ndarray], value: float) -> None:
    """Fill the region enclosed by ``polygons`` (px, sub-pixel vertices) with ``value`` in place.

    The paths are filled together with the even-odd rule, so holes returned by
    :func:`offset_polygon` stay empty; fill overlapping polygons in separate calls. Paths reaching
    far outside the canvas are clipped first, so any finite coordinates below
    ``MAX_ABS_COORDINATE_PX`` are safe.
    """
    paths = [_to_clipper(polygon) for polygon in polygons if len(polygon) > 0]
    if not paths:
        return
    height, width = canvas.shape[:2]
    stacked = paths[0] if len(paths) == 1 else np.concatenate(paths)
    low, high = stacked.min(axis=0), stacked.max(axis=0)
    margin = _FILL_MARGIN_PX * CLIPPER_SCALE
    window = (-margin, -margin, width * CLIPPER_SCALE + margin, height * CLIPPER_SCALE + margin)
    if low.min() < -margin or high[0] > window[2] or high[1] > window[3]:
        paths = _clip_fixed_point_paths(paths, window)
        if not paths:
            return
    cv2.fillPoly(
        canvas,
        [path.astype(np.int32).reshape(-1, 1, 2) for path in paths],
        float(value),
        lineType=cv2.LINE_8,
        shift=FILL_SHIFT,
    )


def min_area_rect(points: np.ndarray) -> tuple[np.ndarray, float]:
    """Minimum-area rectangle around ``points``: corners (4, 2) float64 and short side (px)."""
    rect = cv2.minAreaRect(np.asarray(points, dtype=np.float32).reshape(-1, 1, 2))
    corners = cv2.boxPoints(rect).astype(np.float64)
    return corners, float(min(rect[1]))


def order_clockwise(quad: np.ndarray) -> np.ndarray:
    """Order 4 corners clockwise as seen on screen (y down), starting at the top-left one.

    The top-left corner is the one with the smallest x + y; ties go to the first in clockwise
    order, so the result is deterministic.
    """
    quad = np.asarray(quad, dtype=np.float64)
    centre = quad.mean(axis=0)
    # With y pointing down, increasing atan2 angle turns clockwise on screen.
    angles = np.arctan2(quad[:, 1] - centre[1], quad[:, 0] - centre[0])
    order = np.argsort(angles, kind="stable")
    start = int(np.argmin(quad[order].sum(axis=1)))
    return quad[np.concatenate((order[start:], order[:start]))]


def padded_vertices(polygons: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack polygons of different lengths: (n, V, 2) float64 vertices and (n,) vertex counts.

    Rows are padded by repeating their last vertex, which adds only zero-length edges.
    """
    counts = np.array([len(polygon) for polygon in polygons], dtype=np.int64)
    width = int(counts.max()) if counts.size else 0
    if counts.size and counts.min() == width:
        return np.stack(polygons).astype(np.float64, copy=False), counts
    stacked = np.zeros((len(polygons), width, 2), dtype=np.float64)
    for row, polygon in enumerate(polygons):
        stacked[row, : len(polygon)] = polygon
        stacked[row, len(polygon) :] = polygon[-1]
    return stacked, counts


def convex_flags(vertices: np.ndarray) -> np.ndarray:
    """(n,) bool: whether each padded simple polygon of ``vertices`` (n, V, 2) is convex.

    Repeated vertices (padding included) are skipped and collinear ones allowed: every turn
    between consecutive edges of non-zero length must go the same way.
    """
    if vertices.shape[1] == 0:
        return np.zeros(len(vertices), dtype=bool)
    edges = np.roll(vertices, -1, axis=1) - vertices
    real = (edges != 0).any(axis=2)
    # Compact the non-zero edges to the front of each row, keeping their order.
    order = np.argsort(~real, axis=1, kind="stable")
    edges = np.take_along_axis(edges, order[..., None], axis=1)
    count = real.sum(axis=1)[:, None]
    slots = np.arange(edges.shape[1])[None, :]
    following = np.take_along_axis(
        edges, np.where(slots + 1 < count, slots + 1, 0)[..., None], axis=1
    )
    turns = np.where(slots < count, _cross(edges, following), 0.0)
    return ~((turns > 0).any(axis=1) & (turns < 0).any(axis=1))


def signed_areas(vertices: np.ndarray) -> np.ndarray:
    """(n,) shoelace areas (px²) of padded polygons, positive for counter-clockwise in x-y axes."""
    following = np.roll(vertices, -1, axis=1)
    cross = vertices[..., 0] * following[..., 1] - vertices[..., 1] * following[..., 0]
    return 0.5 * cross.sum(axis=1)


def convex_intersection_areas(subjects: np.ndarray, clips: np.ndarray) -> np.ndarray:
    """Areas (px²) of ``subjects[k] ∩ clips[k]`` for K pairs of padded polygons, vectorised.

    ``clips`` (K, C, 2) must be convex; ``subjects`` (K, S, 2) may be any simple polygons.
    Sutherland–Hodgman clipping, all pairs at once. Each pair is moved so that its clip polygon
    starts at the origin first, which keeps rounding errors at the scale of the polygons rather
    than of their image coordinates.
    """
    count = len(subjects)
    if count == 0:
        return np.zeros(0)
    origin = clips[:, :1, :]
    clips = clips - origin
    # Orient every clip polygon counter-clockwise so that "inside" is "left of each edge".
    clockwise = signed_areas(clips) < 0
    clips = np.where(clockwise[:, None, None], clips[:, ::-1], clips)
    capacity = subjects.shape[1] + clips.shape[1]
    points = np.zeros((count, capacity, 2))
    points[:, : subjects.shape[1]] = subjects - origin
    sizes = np.full(count, subjects.shape[1], dtype=np.int64)
    slots = np.arange(capacity)
    rows = np.arange(count)[:, None]
    for edge in range(clips.shape[1]):
        start = clips[:, edge][:, None, :]
        direction = clips[:, (edge + 1) % clips.shape[1]][:, None, :] - start
        following_index = np.where(slots[None, :] + 1 < sizes[:, None], slots[None, :] + 1, 0)
        following = points[rows, following_index]
        side_here = _cross(direction, points - start)
        side_next = _cross(direction, following - start)
        present = slots[None, :] < sizes[:, None]
        keep_here = present & (side_here >= 0)
        crossing = present & ((side_here >= 0) != (side_next >= 0))
        with np.errstate(divide="ignore", invalid="ignore"):
            fraction = side_here / (side_here - side_next)
        crossing_point = points + np.where(crossing, fraction, 0.0)[..., None] * (
            following - points
        )
        candidates = np.stack((points, crossing_point), axis=2).reshape(count, 2 * capacity, 2)
        keep = np.stack((keep_here, crossing), axis=2).reshape(count, 2 * capacity)
        # Move the kept points to the front of each row, in order. A half-plane adds at most
        # one vertex to a convex subject, but a non-convex one can gain more: grow if needed.
        sizes = keep.sum(axis=1)
        capacity = max(capacity, int(sizes.max()))
        order = np.argsort(~keep, axis=1, kind="stable")[:, :capacity]
        points = candidates[rows, order]
        slots = np.arange(capacity)
    following_index = np.where(slots[None, :] + 1 < sizes[:, None], slots[None, :] + 1, 0)
    following = points[rows, following_index]
    present = slots[None, :] < sizes[:, None]
    cross = points[..., 0] * following[..., 1] - points[..., 1] * following[..., 0]
    return 0.5 * np.abs(np.where(present, cross, 0.0).sum(axis=1))


def _cross(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    return first[..., 0] * second[..., 1] - first[..., 1] * second[..., 0]
