"""ICDAR 2015 text-localisation evaluation, DB protocol (DBNet's shapely port), fast.

This is what training's ``val/hmean`` and ``--protocol db`` use, for comparison with DB-style
papers. It differs from the official RRC script (``--protocol official``, see
:mod:`vramkit.tasks.text_detection.evaluation.rrc_protocol`) on what real submissions contain:

- ground-truth and detection polygons that are not valid simple polygons (self-intersecting,
  zero area, fewer than 3 points, non-finite) are skipped, as the shapely port used by DBNet's
  reference code does, and counted in ``invalid_gt`` / ``invalid_det``; transcriptions are
  trimmed of spaces before the ``###`` test; a confidence column is allowed;
- a detection is don't-care when intersection / detection area > 0.5 for some single ``###``
  ground-truth region (checked in ground-truth order);
- IoU = intersection / (detection area + ground-truth area − intersection); a pair matches when
  IoU > 0.5; matching is one-to-one and greedy, ground truth in file order, and for each one the
  first unmatched care detection in file order;
- counts are summed over the whole set (micro average): precision = matched / care detections
  (0 when there are none), recall = matched / care ground truth (0 when there is none), hmean
  their harmonic mean (0 when both are 0). The per-image values of :class:`ImageCounts` follow
  the script too: an image without care ground truth has recall 1 and precision 1 only if it
  has no care detections.

The official script intersects every gt × detection pair in a Python loop. Here the pairs are
first pruned with axis-aligned bounding boxes, exactly: a pair is dropped only when even the
largest intersection its boxes and areas allow could not pass the threshold. The survivors are
intersected all at once in numpy (Sutherland–Hodgman clipping by whichever polygon is convex).
A pair whose decision lies within a rounding margin of the threshold, or whose polygons are both
non-convex, is recomputed with shapely in the argument order of the script (detection first for
IoU, ground truth first for the don't-care test), so the counts are identical to an all-pairs
shapely loop.

Command line: ``python -m vramkit.tasks.text_detection.evaluation.icdar_eval GT_DIR PRED_DIR
[--strict]``
prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import shapely

from vramkit.tasks.text_detection.data.icdar_format import (
    AnnotationError,
    read_detections,
    read_ground_truth,
)
from vramkit.tasks.text_detection.data.polygon_geometry import (
    convex_flags,
    convex_intersection_areas,
    padded_vertices,
)
from vramkit.tasks.text_detection.evaluation.rrc_protocol import method_scores

IOU_THRESHOLD = 0.5
AREA_PRECISION_THRESHOLD = 0.5
# Bounding-box bounds are exact in real arithmetic; this slack keeps pairs whose bound sits at
# the threshold up to float rounding, so pruning never changes a decision.
_PRUNE_SLACK = 1e-9
# Intersections clipped in numpy agree with shapely's to about 1e-15 of the squared extent of
# the pair; a pair whose decision lies within this (much larger) margin is recomputed by shapely.
_AREA_ERROR = 1e-9


@dataclass(frozen=True)
class ImageCounts:
    """Matching counts of one image."""

    matched: int
    gt_care: int
    det_care: int
    invalid_gt: int = 0  # skipped ground-truth polygons (not valid simple polygons)
    invalid_det: int = 0  # skipped detection polygons

    @property
    def recall(self) -> float:
        """Per-image recall: 1 when the image has no care ground truth."""
        return 1.0 if self.gt_care == 0 else self.matched / self.gt_care

    @property
    def precision(self) -> float:
        """Per-image precision: without care ground truth, 1 only if nothing was detected."""
        if self.gt_care == 0:
            return 0.0 if self.det_care > 0 else 1.0
        return 0.0 if self.det_care == 0 else self.matched / self.det_care


@dataclass
class _Polygons:
    geometries: np.ndarray  # shapely Polygons of the valid input polygons, input order kept
    kept: np.ndarray  # input index of each geometry
    vertices: np.ndarray  # (n, V, 2) padded vertices, see padded_vertices
    convex: np.ndarray  # (n,) bool
    bounds: np.ndarray  # (n, 4) xmin, ymin, xmax, ymax
    areas: np.ndarray  # (n,) px², as shapely computes them (the reference does the same)
    invalid: int  # input polygons skipped


def _valid_polygons(polygons: Sequence[np.ndarray]) -> _Polygons:
    arrays = [np.asarray(polygon, dtype=np.float64) for polygon in polygons]
    shaped = [
        index
        for index, array in enumerate(arrays)
        if array.ndim == 2 and array.shape[1] == 2 and array.shape[0] >= 3
    ]
    kept = np.array(shaped, dtype=np.int64)
    geometries = np.empty(0, dtype=object)
    if shaped:
        lengths = np.array([len(arrays[i]) for i in shaped])
        coords = np.concatenate([arrays[i] for i in shaped])
        ring_ids = np.repeat(np.arange(len(shaped)), lengths)
        finite = np.bincount(ring_ids, weights=~np.isfinite(coords).all(axis=1)) == 0
        if not finite.all():
            kept = kept[finite]
            coords = coords[finite[ring_ids]]
            ring_ids = np.repeat(np.arange(kept.size), lengths[finite])
        if kept.size:
            # One vectorised GEOS call per step for the whole image instead of a Python loop.
            geometries = shapely.polygons(shapely.linearrings(coords, indices=ring_ids))
            valid = shapely.is_valid(geometries)
            geometries, kept = geometries[valid], kept[valid]
    vertices, _ = padded_vertices([arrays[i] for i in kept])
    return _Polygons(
        geometries=geometries,
        kept=kept,
        vertices=vertices,
        convex=convex_flags(vertices),
        bounds=shapely.bounds(geometries).reshape(-1, 4),
        areas=shapely.area(geometries),
        invalid=len(arrays) - len(geometries),
    )


def _box_overlap_areas(first_bounds: np.ndarray, second_bounds: np.ndarray) -> np.ndarray:
    """(n, m) areas (px²) of the intersections of two sets of axis-aligned boxes."""
    width = np.minimum(first_bounds[:, None, 2], second_bounds[None, :, 2]) - np.maximum(
        first_bounds[:, None, 0], second_bounds[None, :, 0]
    )
    height = np.minimum(first_bounds[:, None, 3], second_bounds[None, :, 3]) - np.maximum(
        first_bounds[:, None, 1], second_bounds[None, :, 1]
    )
    return np.clip(width, 0.0, None) * np.clip(height, 0.0, None)


def _fast_intersections(
    first: _Polygons, first_index: np.ndarray, second: _Polygons, second_index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Areas (px²) of ``first[i] ∩ second[j]`` per pair, and a bound on their rounding error.

    Pairs where one polygon is convex are clipped in numpy; the others get an infinite error
    bound, which sends them to shapely.
    """
    areas = np.zeros(first_index.size)
    errors = np.full(first_index.size, np.inf)
    clip_by_first = first.convex[first_index]
    clip_by_second = ~clip_by_first & second.convex[second_index]
    for use, subject, subject_index, clip, clip_index in (
        (clip_by_first, second, second_index, first, first_index),
        (clip_by_second, first, first_index, second, second_index),
    ):
        if not use.any():
            continue
        areas[use] = convex_intersection_areas(
            subject.vertices[subject_index[use]], clip.vertices[clip_index[use]]
        )
        low = np.minimum(subject.bounds[subject_index[use], :2], clip.bounds[clip_index[use], :2])
        high = np.maximum(subject.bounds[subject_index[use], 2:], clip.bounds[clip_index[use], 2:])
        extent = (high - low).max(axis=1)
        errors[use] = _AREA_ERROR * (extent * extent + 1.0)
    return areas, errors


def _dont_care_detections(gt: _Polygons, dont_care: np.ndarray, det: _Polygons) -> np.ndarray:
    """Boolean per detection: more than half of it lies inside some single ``###`` region."""
    result = np.zeros(len(det.geometries), dtype=bool)
    if dont_care.size == 0 or result.size == 0:
        return result
    # The intersection is bounded by both the box overlap and the ### region's own area.
    bound = np.minimum(
        _box_overlap_areas(gt.bounds[dont_care], det.bounds), gt.areas[dont_care][:, None]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        possible = bound / det.areas[None, :] > AREA_PRECISION_THRESHOLD - _PRUNE_SLACK
    rows, cols = np.nonzero(possible)
    if rows.size == 0:
        return result
    gi = dont_care[rows]
    det_area = det.areas[cols]
    inter, error = _fast_intersections(gt, gi, det, cols)
    inside = inter > AREA_PRECISION_THRESHOLD * det_area
    unsure = np.flatnonzero(np.abs(inter - AREA_PRECISION_THRESHOLD * det_area) <= error)
    if unsure.size:
        exact = shapely.area(
            shapely.intersection(gt.geometries[gi[unsure]], det.geometries[cols[unsure]])
        )
        area = det_area[unsure]
        with np.errstate(divide="ignore", invalid="ignore"):
            precision = np.where(area == 0, 0.0, exact / area)
        inside[unsure] = precision > AREA_PRECISION_THRESHOLD
    result[cols[inside]] = True
    return result


def _iou_pairs(
    gt: _Polygons, gt_rows: np.ndarray, det: _Polygons, det_cols: np.ndarray
) -> list[tuple[int, int]]:
    """(gt, det) index pairs with IoU > 0.5, sorted by gt then detection index."""
    if gt_rows.size == 0 or det_cols.size == 0:
        return []
    gt_area = gt.areas[gt_rows][:, None]
    det_area = det.areas[det_cols][None, :]
    bound = np.minimum(
        _box_overlap_areas(gt.bounds[gt_rows], det.bounds[det_cols]),
        np.minimum(gt_area, det_area),
    )
    # IoU grows with the intersection, so the bound on the intersection bounds the IoU.
    with np.errstate(divide="ignore", invalid="ignore"):
        best_iou = bound / (det_area + gt_area - bound)
    rows, cols = np.nonzero(best_iou > IOU_THRESHOLD - _PRUNE_SLACK)
    if rows.size == 0:
        return []
    gi, di = gt_rows[rows], det_cols[cols]
    inter, error = _fast_intersections(gt, gi, det, di)
    # IoU > t  <=>  inter > t·(area_d + area_g) / (1 + t), away from rounding.
    needed = IOU_THRESHOLD * (det.areas[di] + gt.areas[gi]) / (1.0 + IOU_THRESHOLD)
    hits = inter > needed
    unsure = np.flatnonzero(np.abs(inter - needed) <= error)
    if unsure.size:
        # Decided as the reference does it: detection first, then the same float expression.
        exact = shapely.area(
            shapely.intersection(det.geometries[di[unsure]], gt.geometries[gi[unsure]])
        )
        union = det.areas[di[unsure]] + gt.areas[gi[unsure]] - exact
        with np.errstate(divide="ignore", invalid="ignore"):
            hits[unsure] = exact / union > IOU_THRESHOLD
    # np.nonzero walks row-major, so the pairs are already in (gt, detection) order.
    return list(zip(gi[hits].tolist(), di[hits].tolist(), strict=True))


def match_image(
    gt_polygons: Sequence[np.ndarray],
    gt_ignore: Sequence[bool],
    det_polygons: Sequence[np.ndarray],
) -> ImageCounts:
    """Match one image's detections to its ground truth under the ICDAR 2015 protocol.

    Polygons are (N, 2) vertex arrays in px; ``gt_ignore[i]`` marks ``###`` regions.
    """
    if len(gt_polygons) != len(gt_ignore):
        raise ValueError(f"{len(gt_polygons)} ground-truth polygons but {len(gt_ignore)} flags")
    gt = _valid_polygons(gt_polygons)
    det = _valid_polygons(det_polygons)
    gt_dont_care = np.asarray(gt_ignore, dtype=bool).reshape(-1)[gt.kept]
    det_dont_care = _dont_care_detections(gt, np.flatnonzero(gt_dont_care), det)

    care_rows = np.flatnonzero(~gt_dont_care)
    care_cols = np.flatnonzero(~det_dont_care)
    gt_taken: set[int] = set()
    det_taken: set[int] = set()
    for g, d in _iou_pairs(gt, care_rows, det, care_cols):
        if g not in gt_taken and d not in det_taken:
            gt_taken.add(g)
            det_taken.add(d)
    return ImageCounts(
        matched=len(gt_taken),
        gt_care=int(care_rows.size),
        det_care=int(care_cols.size),
        invalid_gt=gt.invalid,
        invalid_det=det.invalid,
    )


def summarize(counts: Iterable[ImageCounts]) -> dict[str, float | int]:
    """Micro-averaged precision, recall and hmean over a set of images, with the summed counts."""
    matched = gt_care = det_care = invalid_gt = invalid_det = 0
    for image in counts:
        matched += image.matched
        gt_care += image.gt_care
        det_care += image.det_care
        invalid_gt += image.invalid_gt
        invalid_det += image.invalid_det
    scores = method_scores(matched, gt_care, det_care)
    return {**scores, "invalid_gt": invalid_gt, "invalid_det": invalid_det}


def evaluate_folders(
    gt_dir: str | Path, pred_dir: str | Path, *, strict: bool = False
) -> dict[str, float | int]:
    """Evaluate a folder of ``res_<name>.txt`` submissions against ``gt_<name>.txt`` files.

    A missing submission file means no detections. Malformed lines are warned about (file:line)
    and counted under ``bad_lines``; with ``strict=True`` the first one raises
    :class:`~vramkit.core.data.bad_lines.AnnotationError`, as does a submission file for an image
    that has no ground truth (otherwise warned about and counted under ``unmatched_predictions``).
    """
    gt_dir, pred_dir = Path(gt_dir), Path(pred_dir)
    for folder, role in ((gt_dir, "ground-truth"), (pred_dir, "prediction")):
        if not folder.is_dir():
            raise FileNotFoundError(f"{role} folder {folder} does not exist")
    gt_files = sorted(gt_dir.glob("gt_*.txt"))
    if not gt_files:
        raise FileNotFoundError(f"no gt_<name>.txt files in {gt_dir}")
    names = [path.name[len("gt_") : -len(".txt")] for path in gt_files]

    unmatched = sorted(
        path.name
        for path in pred_dir.glob("res_*.txt")
        if path.name[len("res_") : -len(".txt")] not in set(names)
    )
    for name in unmatched:
        message = f"{pred_dir / name}: no ground truth gt_{name[len('res_') :]} in {gt_dir}"
        if strict:
            raise AnnotationError(message)
        warnings.warn(message, stacklevel=2)

    counts = []
    bad_lines = 0
    for name, gt_path in zip(names, gt_files, strict=True):
        truth = read_ground_truth(gt_path, strict=strict)
        detections = read_detections(pred_dir / f"res_{name}.txt", strict=strict)
        for bad in truth.bad_lines + detections.bad_lines:
            warnings.warn(f"skipped malformed line {bad}", stacklevel=2)
        bad_lines += len(truth.bad_lines) + len(detections.bad_lines)
        counts.append(match_image(truth.polygons, truth.ignore, detections.polygons))
    result = summarize(counts)
    result.update(images=len(counts), bad_lines=bad_lines, unmatched_predictions=len(unmatched))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints the result as one JSON line on stdout."""
    parser = argparse.ArgumentParser(
        prog="python -m vramkit.tasks.text_detection.evaluation.icdar_eval",
        description="ICDAR 2015 text-localisation evaluation (IoU > 0.5, micro average).",
    )
    parser.add_argument("gt_dir", type=Path, help="folder of gt_<name>.txt files")
    parser.add_argument("pred_dir", type=Path, help="folder of res_<name>.txt files")
    parser.add_argument(
        "--strict", action="store_true", help="fail on the first malformed line or stray file"
    )
    args = parser.parse_args(argv)
    try:
        result = evaluate_folders(args.gt_dir, args.pred_dir, strict=args.strict)
    except (AnnotationError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
