"""ICDAR 2015 evaluation speed: vramkit's matcher against a plain all-pairs shapely loop.

Both evaluate the same generated images, each with 300 ground-truth quadrilaterals (a tenth of
them ``###``, a few self-intersecting or non-convex) and 300 detections (most of them jittered
copies of ground truth, so IoUs spread around the 0.5 threshold; integer coordinates, as in
submission files, so exact ties occur). The reference below is written the way the official
``script.py`` is: every ground-truth × detection pair goes through the polygon library. The
per-image counts of the two must be identical; the benchmark stops otherwise.

``python -m benchmarks.evaluation [--images N]`` writes ``results/evaluation.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import shapely

from benchmarks.record import RESULTS_DIR, write_result
from vramkit.tasks.text_detection.icdar_eval import ImageCounts, match_image, summarize

IOU_THRESHOLD = 0.5
AREA_PRECISION_THRESHOLD = 0.5
IMAGE_WIDTH, IMAGE_HEIGHT = 1280, 720  # px, the ICDAR 2015 image size


def _rotated_box(rng: np.random.Generator, centre: np.ndarray, width: float, height: float):
    angle = np.deg2rad(rng.uniform(-20, 20))
    axes = np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
    corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [width / 2, height / 2]
    return centre + corners @ axes


def make_scene(
    rng: np.random.Generator, gt_count: int = 300, det_count: int = 300
) -> tuple[list[np.ndarray], list[bool], list[np.ndarray]]:
    """One image's ground truth (polygons, ``###`` flags) and detections, in px."""
    gt: list[np.ndarray] = []
    for _ in range(gt_count):
        centre = rng.uniform([0, 0], [IMAGE_WIDTH, IMAGE_HEIGHT])
        gt.append(_rotated_box(rng, centre, rng.uniform(20, 160), rng.uniform(10, 50)))
    ignore = [bool(flag) for flag in rng.uniform(size=gt_count) < 0.1]
    # A bow-tie (self-intersecting, skipped by the protocol) and a dart (non-convex) or two.
    for index in rng.choice(gt_count, 4, replace=False):
        quad = gt[index]
        gt[index] = quad[[0, 2, 1, 3]] if index % 2 else np.array([*quad[:3], quad.mean(axis=0)])
    detections: list[np.ndarray] = []
    copies = int(det_count * 0.8)
    for source in rng.choice(gt_count, copies):
        quad = gt[source]
        centre = quad.mean(axis=0)
        size = np.ptp(quad, axis=0)
        scale = rng.uniform(0.75, 1.25, 2)
        shift = rng.normal(0.0, 0.15, 2) * size
        detections.append((quad - centre) * scale + centre + shift)
    for _ in range(det_count - copies):
        centre = rng.uniform([0, 0], [IMAGE_WIDTH, IMAGE_HEIGHT])
        detections.append(_rotated_box(rng, centre, rng.uniform(20, 160), rng.uniform(10, 50)))
    detections[0] = detections[0][[0, 2, 1, 3]]  # one self-intersecting detection
    gt = [np.round(quad) for quad in gt]
    detections = [np.round(quad) for quad in detections]
    return gt, ignore, detections


def all_pairs_match(
    gt_polygons: Sequence[np.ndarray], gt_ignore: Sequence[bool], det_polygons: Sequence[np.ndarray]
) -> ImageCounts:
    """The official script's loops, one shapely intersection per pair; counts as vramkit's."""
    gt = [(index, shapely.Polygon(points)) for index, points in enumerate(gt_polygons)]
    det = [shapely.Polygon(points) for points in det_polygons]
    gt_valid = [(index, polygon) for index, polygon in gt if polygon.is_valid]
    det_valid = [polygon for polygon in det if polygon.is_valid]
    dont_care_regions = [polygon for index, polygon in gt_valid if gt_ignore[index]]
    det_dont_care = []
    for detection in det_valid:
        area = detection.area
        for region in dont_care_regions:
            inside = region.intersection(detection).area
            if (0.0 if area == 0 else inside / area) > AREA_PRECISION_THRESHOLD:
                det_dont_care.append(True)
                break
        else:
            det_dont_care.append(False)
    # As the script does: the whole IoU matrix first, then greedy one-to-one matching.
    iou = np.zeros((len(gt_valid), len(det_valid)))
    for g, (_, truth) in enumerate(gt_valid):
        for d, detection in enumerate(det_valid):
            inter = detection.intersection(truth).area
            union = detection.area + truth.area - inter
            iou[g, d] = 0.0 if union == 0 else inter / union
    gt_taken = [False] * len(gt_valid)
    det_taken = [False] * len(det_valid)
    matched = 0
    for g, (index, _) in enumerate(gt_valid):
        for d in range(len(det_valid)):
            if gt_taken[g] or det_taken[d] or gt_ignore[index] or det_dont_care[d]:
                continue
            if iou[g, d] > IOU_THRESHOLD:
                gt_taken[g] = det_taken[d] = True
                matched += 1
    return ImageCounts(
        matched=matched,
        gt_care=sum(not gt_ignore[index] for index, _ in gt_valid),
        det_care=det_dont_care.count(False),
        invalid_gt=len(gt) - len(gt_valid),
        invalid_det=len(det) - len(det_valid),
    )


def _timed(function, scenes, repeats: int) -> tuple[list[ImageCounts], float, float]:
    """Counts per image and the best (CPU, wall) seconds over ``repeats`` passes."""
    best_cpu = best_wall = float("inf")
    counts: list[ImageCounts] = []
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        counts = [function(*scene) for scene in scenes]
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return counts, best_cpu, best_wall


def run(images: int = 3, gt_count: int = 300, det_count: int = 300, seed: int = 0) -> dict:
    """Time both evaluations on ``images`` generated images; raise if their counts differ."""
    rng = np.random.default_rng(seed)
    scenes = [make_scene(rng, gt_count, det_count) for _ in range(images)]
    fast_counts, fast_cpu, fast_wall = _timed(match_image, scenes, repeats=5)
    reference_counts, reference_cpu, reference_wall = _timed(all_pairs_match, scenes, repeats=1)
    if fast_counts != reference_counts:
        raise AssertionError(
            f"vramkit's counts differ from the all-pairs reference:\n{fast_counts}\n"
            f"{reference_counts}"
        )
    summary = summarize(fast_counts)
    return {
        "images": images,
        "gt_per_image": gt_count,
        "detections_per_image": det_count,
        "identical_results": True,
        "metrics": summary,
        "vramkit_seconds": round(fast_cpu, 4),
        "all_pairs_seconds": round(reference_cpu, 4),
        "speedup": round(reference_cpu / fast_cpu, 1),
        "vramkit_wall_seconds": round(fast_wall, 4),
        "all_pairs_wall_seconds": round(reference_wall, 4),
        "speedup_wall": round(reference_wall / fast_wall, 1),
        "target_speedup": 20,
        "timing": "process CPU seconds (single thread; robust to other load), best of 5 passes "
        "for vramkit, 1 for the reference; *_wall_* are wall-clock",
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line; returns the numbers written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.evaluation", description=__doc__)
    parser.add_argument("--images", type=int, default=3, help="generated images (300 + 300 each)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder of the JSON file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    numbers = run(images=args.images)
    path = write_result("evaluation", numbers, started=started, directory=args.out)
    print(
        f"evaluation: vramkit {numbers['vramkit_seconds']:.3f} s, all-pairs "
        f"{numbers['all_pairs_seconds']:.2f} s, speedup {numbers['speedup']}x -> {path}"
    )
    return numbers


if __name__ == "__main__":
    main()
