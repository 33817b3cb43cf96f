"""The official ICDAR 2015 task 4.1 evaluation (RRC ``script.py``), its numbers, computed fast.

What the script computes, per image, on the quads read by :mod:`rrc_files` (no quad is skipped:
self-intersecting, zero-area and repeated-point quads all count, with the Polygon library's area
and even-odd intersection, see :mod:`rrc_geometry`):

- a detection is don't-care when, for some ``###`` ground truth, ``area(gt & det) / area(det)``
  exceeds 0.5 (0 when the detection's area is 0);
- IoU is ``inter / (area(det) + area(gt) - inter)``, 0 when that union is 0; a union below 0
  (possible with bow-ties, whose area subtracts their lobes) gives a negative IoU;
- ground truth in file order, detections in file order (sorted by decreasing confidence when
  confidences are given), each care pair with IoU > 0.5 and both sides still free is matched;
- precision, recall and hmean over all images from the summed counts; with confidences, the
  average precision of the global list of care detections ranked by confidence.

All images are matched together: pairs are generated per image, pruned by exact bounds (box
overlap and even-odd areas cannot reach the threshold), and the survivors intersected at once.
A decision within rounding of its threshold is taken again, one pair at a time: with the Polygon
library itself when it is installed (``pip install vramkit[official]``; the script's own float
expression, so the decision is the script's), else in exact rational arithmetic. The two differ
only where the real value sits exactly on the threshold and the intersection has vertices that
are not integers: GPC's rounding then decides (IoU 26/3 / 52/3 = 0.5 exactly comes out as
0.5000000000000001 and matches). Such pairs are counted under ``threshold_ties``; in the seeded
replay test (278 compared cases on small-grid quads) 16 such pairs changed 1 case.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from vramkit.tasks.text_detection.evaluation.rrc_files import (
    GT_NAME,
    SUBMISSION_NAME,
    LenientNotes,
    RrcRefusal,
    parse_samples,
    read_entries,
)
from vramkit.tasks.text_detection.evaluation.rrc_geometry import (
    even_odd_pieces,
    exact_intersection_area,
    pair_intersection_areas,
    polygon_library_areas,
)

IOU_THRESHOLD = 0.5
AREA_PRECISION_THRESHOLD = 0.5
# Pairs generated per block: bounds the memory of the all-pairs pruning (about 100 B a pair).
_PAIRS_PER_BLOCK = 50_000
# Box bounds are exact up to float rounding; this relative slack keeps borderline pairs.
_PRUNE_SLACK = 1e-9


class QuadSet:
    """Quads of many images, concatenated image by image in evaluation order."""

    def __init__(self, quads: np.ndarray, image: np.ndarray) -> None:
        self.quads = quads  # (n, 4, 2) float64, integer-valued px
        self.image = image  # (n,) int64, the image of each quad, non-decreasing
        self.areas = polygon_library_areas(self.quads)
        self.pieces = even_odd_pieces(self.quads)
        vertices, weights = self.pieces
        # Area of the even-odd region: bounds every intersection with it. It differs from the
        # Polygon library's area only for quads cut into two pieces.
        self.filled = self.areas.copy()
        split = np.flatnonzero(weights[:, 1] != 0)
        piece_areas = polygon_library_areas(vertices[split].reshape(-1, 4, 2)).reshape(-1, 2)
        self.filled[split] = np.abs((weights[split] * piece_areas).sum(axis=1))
        # Pairwise minimum/maximum of the four corners: a reduction over an axis of length 4
        # costs numpy more than three element-wise passes.
        q = self.quads
        low = np.minimum(np.minimum(q[:, 0], q[:, 1]), np.minimum(q[:, 2], q[:, 3]))
        high = np.maximum(np.maximum(q[:, 0], q[:, 1]), np.maximum(q[:, 2], q[:, 3]))
        self.bounds = np.concatenate([low, high], axis=1)
        # xmin, ymin, xmax, ymax as contiguous columns: gathered per candidate pair.
        self.box_columns = [np.ascontiguousarray(column) for column in self.bounds.T]


class OfficialCounts(NamedTuple):
    """What the script sums: per-image matches and the care counts, plus per-detection flags."""

    matched: np.ndarray  # (images,) int64
    gt_care: np.ndarray  # (images,) int64
    det_care: np.ndarray  # (images,) int64
    det_dont_care: np.ndarray  # (detections,) bool
    det_matched: np.ndarray  # (detections,) bool
    exact_decisions: int  # pairs decided one by one (within rounding of a threshold)
    threshold_ties: int  # of those, pairs exactly on the threshold, decided by GPC's rounding


def _sweep_windows(
    first: QuadSet, first_rows: np.ndarray, second: QuadSet, second_rows: np.ndarray, axis: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Second-side rows sorted by (image, low edge on ``axis``), and each first row's window.

    A partner's low edge lies between the first box's low edge minus the longest second-side
    extent of its image and the first box's high edge (touching included).
    """
    images = int(max(first.image.max(initial=0), second.image.max(initial=0))) + 1
    # Integer keys (image, coordinate): coordinates are int32 values, so 2**33 separates images.
    shift, span = 2**31, 2**33
    low_edge = second.bounds[second_rows, axis].astype(np.int64)
    extent = second.bounds[second_rows, axis + 2].astype(np.int64) - low_edge
    image = second.image[second_rows]
    keys = image * span + low_edge + shift
    order = np.argsort(keys, kind="stable")
    keys, sorted_rows = keys[order], second_rows[order]
    longest = np.zeros(images, dtype=np.int64)
    np.maximum.at(longest, image, extent)
    first_image = first.image[first_rows]
    base = first_image * span + shift
    first_low = first.bounds[first_rows, axis].astype(np.int64)
    first_high = first.bounds[first_rows, axis + 2].astype(np.int64)
    low = np.searchsorted(keys, base + first_low - longest[first_image], side="left")
    high = np.searchsorted(keys, base + first_high, side="right")
    return sorted_rows, low, high


def _overlapping_pairs(
    first: QuadSet, first_rows: np.ndarray, second: QuadSet, second_rows: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pairs (i, j) of one image whose boxes overlap along x or y (the axis giving fewer pairs).

    A sweep along one axis: the second side sorted by (image, low edge), each first box's
    partners found with two binary searches. Pairs come in blocks, in first-side order, not
    sorted within. Both axes are tried (binary searches only) and the tighter one is used.
    """
    if first_rows.size == 0 or second_rows.size == 0:
        return
    windows = [_sweep_windows(first, first_rows, second, second_rows, axis) for axis in (0, 1)]
    sorted_rows, low, high = min(windows, key=lambda window: int((window[2] - window[1]).sum()))
    counts = high - low
    cumulative = np.cumsum(counts)
    start = 0
    while start < first_rows.size:
        already = cumulative[start - 1] if start else 0
        stop = max(
            start + 1, int(np.searchsorted(cumulative, already + _PAIRS_PER_BLOCK, side="right"))
        )
        block_counts = counts[start:stop]
        total = int(block_counts.sum())
        if total:
            owner = np.repeat(np.arange(start, stop), block_counts)
            block_starts = np.cumsum(block_counts) - block_counts
            offsets = np.arange(total) - np.repeat(block_starts, block_counts)
            yield first_rows[owner], sorted_rows[low[owner] + offsets]
        start = stop


def _candidates(
    gt: QuadSet,
    gt_rows: np.ndarray,
    det: QuadSet,
    det_rows: np.ndarray,
    images: int,
    needed,
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of ``gt_rows`` x ``det_rows`` in one image whose intersection could reach ``needed``.

    ``needed(g, d)`` is the intersection (px²) the decision requires; the bound on the
    intersection is the box overlap and the even-odd area of either side.
    """
    found_g, found_d = [], []
    gx0, gy0, gx1, gy1 = gt.box_columns
    dx0, dy0, dx1, dy1 = det.box_columns
    for g, d in _overlapping_pairs(gt, gt_rows, det, det_rows):
        # Boxes that only touch or miss each other go first, on one column pair each.
        height = np.minimum(gy1[g], dy1[d]) - np.maximum(gy0[g], dy0[d])
        width = np.minimum(gx1[g], dx1[d]) - np.maximum(gx0[g], dx0[d])
        apart = np.flatnonzero((height > 0) & (width > 0))
        g, d = g[apart], d[apart]
        bound = np.minimum(width[apart] * height[apart], np.minimum(gt.filled[g], det.filled[d]))
        need = needed(g, d)
        keep = (need > 0) & (bound >= need * (1.0 - _PRUNE_SLACK))
        found_g.append(g[keep])
        found_d.append(d[keep])
    if not found_g:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    g, d = np.concatenate(found_g), np.concatenate(found_d)
    order = np.lexsort((d, g))  # ground truth, then detection: the script's loop order
    return g[order], d[order]


def has_polygon_library() -> bool:
    """Whether the Polygon library (Polygon3), the script's own geometry, is installed."""
    import importlib.util

    return importlib.util.find_spec("Polygon") is not None


_worker: multiprocessing.pool.Pool | None = None


def _polygon_worker() -> multiprocessing.pool.Pool:
    """One spawned process that owns the Polygon library, started at the first tie.

    Polygon3 3.0.9 returns a bool without taking a reference, so any process that imported it
    aborts while exiting ("Fatal Python error: bool_dealloc", exit status 134 on CPython 3.11).
    The library therefore never enters this process; multiprocessing terminates its worker at
    exit instead of letting it finalize.
    """
    global _worker
    if _worker is None:
        _worker = multiprocessing.get_context("spawn").Pool(1)
    return _worker


def polygon_library_intersection(first: np.ndarray, second: np.ndarray) -> float:
    """The Polygon library's intersection area (px²) of two quads, as the script computes it;
    runs in `_polygon_worker`."""
    import Polygon

    both = Polygon.Polygon(first) & Polygon.Polygon(second)
    return 0.0 if len(both) == 0 else both.area()


class _Unsure:
    """Decides pairs within rounding of a threshold, as the script's float expressions do."""

    def __init__(self, tie_breaker: str) -> None:
        if tie_breaker not in ("auto", "polygon", "exact"):
            raise ValueError(f"tie_breaker {tie_breaker!r}: expected auto, polygon or exact")
        self.use_library = tie_breaker != "exact" and has_polygon_library()
        if tie_breaker == "polygon" and not self.use_library:
            raise ImportError("tie_breaker='polygon' needs Polygon3: pip install vramkit[official]")
        self.decided = 0
        self.ties = 0

    def _polygon_intersection(self, first: np.ndarray, second: np.ndarray) -> float:
        return _polygon_worker().apply(polygon_library_intersection, (first, second))

    def inside_dont_care(self, gt_quad: np.ndarray, det_quad: np.ndarray, det_area: float) -> bool:
        """``area(gt & det) / area(det) > 0.5`` (``det_area`` > 0)."""
        from fractions import Fraction  # rarely needed: imported here to keep start-up short

        self.decided += 1
        exact = exact_intersection_area(gt_quad, det_quad)
        self.ties += exact == Fraction(det_area) * Fraction(AREA_PRECISION_THRESHOLD)
        if self.use_library:
            inter = self._polygon_intersection(gt_quad, det_quad)
            return inter / det_area > AREA_PRECISION_THRESHOLD
        return exact > Fraction(det_area) * Fraction(AREA_PRECISION_THRESHOLD)

    def iou_above(self, det_quad: np.ndarray, gt_quad: np.ndarray, total: float) -> bool:
        """``inter / (total - inter) > 0.5``, 0 for a zero union (``total`` = both areas)."""
        self.decided += 1
        exact = exact_intersection_area(det_quad, gt_quad)
        self.ties += exact == total or 3 * exact == total
        if self.use_library:
            inter = self._polygon_intersection(det_quad, gt_quad)
            union = total - inter
            return union != 0 and inter / union > IOU_THRESHOLD
        return 3 * exact > total and exact < total


def counts_library(tie_breaker: str) -> bool:
    """Whether ``tie_breaker`` decides with the Polygon library."""
    return tie_breaker == "polygon" or (tie_breaker == "auto" and has_polygon_library())


def _dont_care_detections(
    gt: QuadSet, gt_dont_care: np.ndarray, det: QuadSet, images: int, unsure: _Unsure
) -> np.ndarray:
    """(detections,) bool: area(gt & det) / area(det) > 0.5 for some ``###`` gt of its image."""
    result = np.zeros(len(det.quads), dtype=bool)
    has_area = np.flatnonzero(det.areas > 0)
    g, d = _candidates(
        gt,
        np.flatnonzero(gt_dont_care),
        det,
        has_area,
        images,
        lambda g, d: AREA_PRECISION_THRESHOLD * det.areas[d],
    )
    if g.size == 0:
        return result
    inter, error = pair_intersection_areas(gt.pieces, g, det.pieces, d, (gt.bounds, det.bounds))
    needed = AREA_PRECISION_THRESHOLD * det.areas[d]
    inside = inter > needed
    for k in np.flatnonzero(np.abs(inter - needed) <= error):
        inside[k] = unsure.inside_dont_care(gt.quads[g[k]], det.quads[d[k]], det.areas[d[k]])
    result[d[inside]] = True
    return result


def _iou_hits(
    gt: QuadSet,
    gt_rows: np.ndarray,
    det: QuadSet,
    det_rows: np.ndarray,
    images: int,
    unsure: _Unsure,
) -> tuple[np.ndarray, np.ndarray]:
    """(gt, det) pairs with IoU > 0.5 in (gt, detection) order."""
    g, d = _candidates(
        gt,
        gt_rows,
        det,
        det_rows,
        images,
        lambda g, d: (gt.areas[g] + det.areas[d]) / 3.0,
    )
    total = gt.areas[g] + det.areas[d]
    usable = total > 0  # otherwise the union is never positive
    g, d, total = g[usable], d[usable], total[usable]
    if g.size == 0:
        return g, d
    inter, error = pair_intersection_areas(det.pieces, d, gt.pieces, g, (det.bounds, gt.bounds))
    # IoU > 0.5 with a positive union  <=>  3 inter > area_d + area_g  and  inter < that sum.
    hits = (3.0 * inter > total) & (inter < total)
    close = (np.abs(3.0 * inter - total) <= 3.0 * error) | (np.abs(total - inter) <= error)
    for k in np.flatnonzero(close):
        hits[k] = unsure.iou_above(det.quads[d[k]], gt.quads[g[k]], total[k])
    return g[hits], d[hits]


def match_official(
    gt: QuadSet,
    gt_dont_care: np.ndarray,
    det: QuadSet,
    images: int,
    *,
    tie_breaker: str = "auto",
) -> OfficialCounts:
    """The script's counts for every image at once (images numbered 0..images-1).

    ``tie_breaker``: how pairs within rounding of a threshold are decided: ``polygon`` (the
    Polygon library, as the script), ``exact`` (rational arithmetic), ``auto`` (the first if
    installed).
    """
    unsure = _Unsure(tie_breaker)
    det_dont_care = _dont_care_detections(gt, gt_dont_care, det, images, unsure)
    hit_g, hit_d = _iou_hits(
        gt, np.flatnonzero(~gt_dont_care), det, np.flatnonzero(~det_dont_care), images, unsure
    )
    gt_taken = np.zeros(len(gt.quads), dtype=bool)
    det_taken = np.zeros(len(det.quads), dtype=bool)
    # Greedy one-to-one, ground truth then detection order, exactly as the script's loops.
    for g, d in zip(hit_g.tolist(), hit_d.tolist(), strict=True):
        if not gt_taken[g] and not det_taken[d]:
            gt_taken[g] = det_taken[d] = True
    return OfficialCounts(
        matched=np.bincount(gt.image[gt_taken], minlength=images),
        gt_care=np.bincount(gt.image[~gt_dont_care], minlength=images),
        det_care=np.bincount(det.image[~det_dont_care], minlength=images),
        det_dont_care=det_dont_care,
        det_matched=det_taken,
        exact_decisions=unsure.decided,
        threshold_ties=unsure.ties,
    )


def average_precision(confidences: np.ndarray, matches: np.ndarray, gt_care: int) -> float:
    """The script's ``compute_ap``: precision at each match down the confidence ranking."""
    if len(confidences) == 0:
        return 0.0
    order = np.argsort(-np.asarray(confidences))
    ranked = np.asarray(matches)[order]
    ranks = np.flatnonzero(ranked) + 1
    precision_sum = 0.0
    for correct, rank in enumerate(ranks.tolist(), start=1):
        precision_sum += float(correct) / rank
    return precision_sum / gt_care if gt_care > 0 else precision_sum


def summarize_official(counts: OfficialCounts) -> dict[str, float | int]:
    """The script's method metrics from summed counts (micro average)."""
    return method_scores(
        int(counts.matched.sum()), int(counts.gt_care.sum()), int(counts.det_care.sum())
    )


def method_scores(matched: int, gt_care: int, det_care: int) -> dict[str, float | int]:
    """Precision, recall and hmean of summed counts, in the script's own expressions (their
    order of operations, so the floats are the script's), with the counts."""
    recall = 0.0 if gt_care == 0 else float(matched) / gt_care
    precision = 0.0 if det_care == 0 else float(matched) / det_care
    hmean = 0.0 if recall + precision == 0 else 2 * recall * precision / (recall + precision)
    return {
        "precision": precision,
        "recall": recall,
        "hmean": hmean,
        "matched": matched,
        "gt_care": gt_care,
        "det_care": det_care,
    }


def evaluate_official(
    gt_location: str | Path,
    submission_location: str | Path,
    *,
    confidences: bool = False,
    lenient: bool = False,
    tie_breaker: str = "auto",
) -> dict:
    """The official script's method metrics for a ground-truth and a submission zip (or folder).

    ``confidences`` is the script's ``CONFIDENCES`` parameter (a confidence column required,
    detections ranked by it, ``AP`` computed). Raises :class:`RrcRefusal` with the script's
    message where it refuses the input; with ``lenient`` the refusals named in
    :mod:`rrc_files` are accepted and reported under ``lenient`` (and warned about).
    """
    return evaluate_entries(
        read_entries(gt_location, GT_NAME, all_entries=False),
        read_entries(submission_location, SUBMISSION_NAME, all_entries=True),
        confidences=confidences,
        lenient=lenient,
        tie_breaker=tie_breaker,
    )


def evaluate_entries(
    gt_raw: dict[str, bytes],
    submission_raw: dict[str, bytes],
    *,
    confidences: bool = False,
    lenient: bool = False,
    tie_breaker: str = "auto",
) -> dict:
    """:func:`evaluate_official` on files already read: {image key: bytes} per side."""
    notes = LenientNotes()
    # The script validates all ground truth, then all submission files, then evaluates.
    truth = parse_samples(gt_raw, ground_truth=True, lenient=lenient, notes=notes)
    stray = [key for key in submission_raw if key not in truth]
    if stray:
        # The script checks each file's name, then its lines, file by file.
        before = list(submission_raw).index(stray[0])
        parse_samples(
            dict(list(submission_raw.items())[:before]),
            ground_truth=False,
            confidences=confidences,
            lenient=lenient,
        )
        raise RrcRefusal(f"The sample {stray[0]} not present in GT")
    detections = parse_samples(
        submission_raw, ground_truth=False, confidences=confidences, lenient=lenient, notes=notes
    )
    keys = list(truth)
    empty = np.zeros((0, 4, 2))
    gt_quads, det_quads, det_scores = [], [], []
    for key in keys:
        gt_quads.append(truth[key].quads)
        sample = detections.get(key)
        if sample is None:
            det_quads.append(empty)
            det_scores.append(np.zeros(0))
        elif confidences and len(sample.quads):
            # The script's own ranking call, so that ties are broken as it breaks them.
            order = np.argsort(-np.array(sample.confidences))
            det_quads.append(sample.quads[order])
            det_scores.append(sample.confidences[order])
        else:
            det_quads.append(sample.quads)
            det_scores.append(sample.confidences)
    images = len(keys)
    gt = QuadSet(
        np.concatenate(gt_quads) if gt_quads else empty,
        np.repeat(np.arange(images), [len(q) for q in gt_quads]),
    )
    det = QuadSet(
        np.concatenate(det_quads) if det_quads else empty,
        np.repeat(np.arange(images), [len(q) for q in det_quads]),
    )
    gt_dont_care = (
        np.concatenate([truth[key].dont_care for key in keys]) if keys else np.zeros(0, bool)
    )
    counts = match_official(gt, gt_dont_care, det, images, tie_breaker=tie_breaker)
    result: dict = {"protocol": "official", **summarize_official(counts)}
    if confidences:
        scores = np.concatenate(det_scores) if det_scores else np.zeros(0)
        care = ~counts.det_dont_care
        result["AP"] = average_precision(
            scores[care].tolist(), counts.det_matched[care].tolist(), int(counts.gt_care.sum())
        )
    result.update(
        images=images,
        submission_files=len(detections),
        exact_decisions=counts.exact_decisions,
        threshold_ties=counts.threshold_ties,
        tie_breaker="polygon" if counts_library(tie_breaker) else "exact",
        lenient=dict(notes.counts) if lenient else None,
    )
    for kind, number in notes.counts.items():
        warnings.warn(
            f"lenient: accepted {number} line(s) the official script refuses ({kind}), "
            f"first: {notes.first[kind]}",
            stacklevel=2,
        )
    return result
