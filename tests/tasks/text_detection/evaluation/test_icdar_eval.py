"""ICDAR 2015 evaluation: hand-computed cases, agreement with an all-pairs reference, files, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import shapely

from vramkit.core.data.bad_lines import AnnotationError
from vramkit.tasks.text_detection.data.polygon_geometry import (
    convex_flags,
    convex_intersection_areas,
    padded_vertices,
)
from vramkit.tasks.text_detection.evaluation.icdar_eval import (
    ImageCounts,
    evaluate_folders,
    match_image,
    summarize,
)

REPO_ROOT = Path(__file__).resolve().parents[4]


def _box(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def reference_match(gt_polygons, gt_ignore, det_polygons) -> ImageCounts:
    """The official script's loops, one shapely intersection per gt x detection pair."""
    gt, dont_care, invalid_gt = [], [], 0
    for points, ignore in zip(gt_polygons, gt_ignore, strict=True):
        polygon = shapely.Polygon(points)
        if not polygon.is_valid:
            invalid_gt += 1
            continue
        gt.append(polygon)
        if ignore:
            dont_care.append(len(gt) - 1)
    det, det_dont_care, invalid_det = [], [], 0
    for points in det_polygons:
        polygon = shapely.Polygon(points)
        if not polygon.is_valid:
            invalid_det += 1
            continue
        det.append(polygon)
        for index in dont_care:
            area = polygon.area
            inside = 0 if area == 0 else gt[index].intersection(polygon).area / area
            if inside > 0.5:
                det_dont_care.append(len(det) - 1)
                break
    matched = 0
    gt_taken, det_taken = set(), set()
    iou = np.empty((len(gt), len(det)))
    for g, gt_polygon in enumerate(gt):
        for d, det_polygon in enumerate(det):
            inter = det_polygon.intersection(gt_polygon).area
            iou[g, d] = inter / (det_polygon.area + gt_polygon.area - inter)
    for g in range(len(gt)):
        for d in range(len(det)):
            free = g not in gt_taken and d not in det_taken
            if free and g not in dont_care and d not in det_dont_care and iou[g, d] > 0.5:
                gt_taken.add(g)
                det_taken.add(d)
                matched += 1
    return ImageCounts(
        matched=matched,
        gt_care=len(gt) - len(dont_care),
        det_care=len(det) - len(det_dont_care),
        invalid_gt=invalid_gt,
        invalid_det=invalid_det,
    )


def test_perfect_match() -> None:
    gt = [_box(0, 0, 100, 40), _box(200, 0, 260, 30)]
    counts = match_image(gt, [False, False], [p.copy() for p in gt])
    assert counts == ImageCounts(matched=2, gt_care=2, det_care=2)
    metrics = summarize([counts])
    assert metrics["precision"] == metrics["recall"] == metrics["hmean"] == 1.0


@pytest.mark.parametrize(("right", "matched"), [(50.0, 0), (49.0, 0), (51.0, 1)])
def test_iou_must_exceed_one_half(right: float, matched: int) -> None:
    # The detection lies inside the ground truth: IoU = right / 100 (0.5 exactly: no match).
    counts = match_image([_box(0, 0, 100, 100)], [False], [_box(0, 0, right, 100)])
    assert counts.matched == matched


def test_matching_is_one_to_one() -> None:
    gt = [_box(0, 0, 100, 40)]
    dets = [_box(2, 0, 100, 40), _box(0, 1, 100, 40)]
    counts = match_image(gt, [False], dets)
    assert counts == ImageCounts(matched=1, gt_care=1, det_care=2)
    assert summarize([counts])["precision"] == 0.5


def test_greedy_matching_follows_ground_truth_order() -> None:
    # gt0 takes the first detection it overlaps enough, even though gt1 fits it better; gt1 then
    # takes the second detection. Reversing the detections changes nothing for the count.
    gt = [_box(0, 0, 100, 40), _box(0, 0, 90, 40)]
    dets = [_box(0, 0, 90, 40), _box(0, 0, 100, 40)]
    assert match_image(gt, [False, False], dets).matched == 2
    assert match_image(gt, [False, False], dets[:1]).matched == 1


def test_detection_mostly_inside_dont_care_is_not_counted() -> None:
    gt = [_box(0, 0, 100, 40), _box(300, 0, 400, 40)]
    inside = _box(300, 0, 360, 40)  # all of it inside ###
    partly = _box(370, 0, 470, 40)  # 30% inside ###: a false positive
    counts = match_image(gt, [False, True], [gt[0].copy(), inside, partly])
    assert counts == ImageCounts(matched=1, gt_care=1, det_care=2)


def test_dont_care_is_judged_per_region_not_summed() -> None:
    # 40% inside each of two ### regions: 80% covered in total, but no single region has > 50%.
    gt = [_box(0, 0, 40, 40), _box(60, 0, 100, 40)]
    counts = match_image(gt, [True, True], [_box(0, 0, 100, 40)])
    assert counts == ImageCounts(matched=0, gt_care=0, det_care=1)


def test_image_without_care_ground_truth() -> None:
    empty = match_image([_box(0, 0, 50, 20)], [True], [])
    assert (empty.precision, empty.recall) == (1.0, 1.0)
    with_detection = match_image([_box(0, 0, 50, 20)], [True], [_box(200, 200, 260, 230)])
    assert (with_detection.precision, with_detection.recall) == (0.0, 1.0)
    # Micro average: nothing to find and nothing found gives 0, as the official script has it.
    assert summarize([empty])["hmean"] == 0.0
    assert summarize([with_detection])["precision"] == 0.0


def test_invalid_polygons_are_skipped_and_counted() -> None:
    bow_tie = np.array([[0, 0], [100, 40], [100, 0], [0, 40]], dtype=np.float64)
    gt = [bow_tie, _box(0, 100, 100, 140)]
    dets = [bow_tie, _box(0, 100, 100, 140), np.array([[0, 0], [1, 1]]), _box(0, 0, 0, 10)]
    counts = match_image(gt, [False, False], dets)
    assert counts == ImageCounts(matched=1, gt_care=1, det_care=1, invalid_gt=1, invalid_det=3)
    assert summarize([counts])["invalid_det"] == 3


def _random_scene(rng: np.random.Generator, count: int) -> tuple[list, list, list]:
    gt = []
    for _ in range(count):
        centre = rng.uniform([0, 0], [640, 360])
        width, height, angle = rng.uniform(10, 120), rng.uniform(6, 40), rng.uniform(-0.5, 0.5)
        c, s = np.cos(angle), np.sin(angle)
        corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [width / 2, height / 2]
        gt.append(corners @ np.array([[c, s], [-s, c]]) + centre)
    ignore = list(rng.random(count) < 0.3)
    dets = []
    for polygon in gt:
        kind = rng.integers(5)
        if kind == 0:
            dets.append(polygon.copy())  # exact copy: shared edges everywhere
        elif kind == 1:
            dets.append(np.round(polygon + rng.normal(0, 3, (4, 2))))  # integer file coordinates
        elif kind == 2:  # a dent: non-convex
            dent = polygon.mean(axis=0) * 0.3 + polygon[0] * 0.35 + polygon[1] * 0.35
            dets.append(np.insert(polygon, 1, dent, axis=0))
        elif kind == 3:
            dets.append(polygon[::-1] + rng.normal(0, 6, (4, 2)))  # other orientation
        else:
            dets.append(polygon[[0, 2, 1, 3]])  # bow-tie: invalid
    return gt, ignore, dets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_the_all_pairs_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    gt, ignore, dets = _random_scene(rng, 60)
    assert match_image(gt, ignore, dets) == reference_match(gt, ignore, dets)


def test_agrees_with_the_reference_at_the_threshold() -> None:
    # IoU within rounding of 0.5 in both directions, and non-convex polygons on both sides.
    gt = [_box(0, 0, 3, 1), _box(10, 0, 13, 1), _box(20, 0, 23, 1)]
    ell = np.array([[0, 0], [3, 0], [3, 1], [1, 1], [1, 3], [0, 3]], dtype=np.float64)
    gt.append(ell + np.array([40.0, 0.0]))
    dets = [
        _box(0, 0, 1.5, 1),
        _box(10, 0, 11.5 + 1e-12, 1),
        _box(20, 0, 21.5 - 1e-12, 1),
        ell + np.array([40.0, 0.001]),
    ]
    assert match_image(gt, [False] * 4, dets) == reference_match(gt, [False] * 4, dets)


def test_convexity_sees_through_padding_and_repeated_vertices() -> None:
    dart = np.array([[0, 0], [10, 5], [0, 10], [3, 5]], dtype=np.float64)
    square = _box(0, 0, 10, 10)
    doubled = np.array([[0, 0], [10, 0], [10, 0], [10, 10], [0, 10]], dtype=np.float64)
    vertices, counts = padded_vertices([dart, square, doubled, np.zeros((6, 2))])
    assert vertices.shape == (4, 6, 2) and counts.tolist() == [4, 4, 5, 6]
    # The dart's reflex vertex is its last one, next to the padding.
    assert convex_flags(vertices).tolist() == [False, True, True, True]


def test_numpy_clipping_matches_shapely_for_non_convex_subjects() -> None:
    comb = np.array(
        [
            [0, 0],
            [10, 0],
            [10, 10],
            [8, 10],
            [8, 2],
            [6, 2],
            [6, 10],
            [4, 10],
            [4, 2],
            [2, 2],
            [2, 10],
            [0, 10],
        ],
        dtype=np.float64,
    )
    clip = np.array([[1, 1], [9, 3], [9, 9], [1, 7]], dtype=np.float64)
    subjects, _ = padded_vertices([comb, comb[::-1]])
    clips, _ = padded_vertices([clip, clip[::-1]])
    expected = shapely.Polygon(comb).intersection(shapely.Polygon(clip)).area
    assert convex_intersection_areas(subjects, clips) == pytest.approx([expected, expected])


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def submission(tmp_path: Path) -> tuple[Path, Path]:
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    _write(gt_dir / "gt_a.txt", ["0,0,100,0,100,40,0,40,hello", "200,0,300,0,300,40,200,40,###"])
    _write(gt_dir / "gt_b.txt", ["0,0,50,0,50,20,0,20,world"])
    _write(
        pred_dir / "res_a.txt", ["0,0,100,0,100,40,0,40,0.9", "1,2,3", "210,0,290,0,290,40,210,40"]
    )
    return gt_dir, pred_dir


def test_folders_missing_prediction_means_no_detections(submission) -> None:
    gt_dir, pred_dir = submission
    with pytest.warns(UserWarning, match=r"res_a\.txt:2"):
        result = evaluate_folders(gt_dir, pred_dir)
    assert result["matched"] == 1 and result["gt_care"] == 2 and result["det_care"] == 1
    assert result["precision"] == 1.0 and result["recall"] == 0.5
    assert result["hmean"] == pytest.approx(2 / 3)
    assert result["bad_lines"] == 1 and result["images"] == 2


def test_folders_strict_refuses_a_malformed_line(submission) -> None:
    gt_dir, pred_dir = submission
    with pytest.raises(AnnotationError, match=r"res_a\.txt:2"):
        evaluate_folders(gt_dir, pred_dir, strict=True)


def test_folders_warn_about_a_prediction_without_ground_truth(submission) -> None:
    gt_dir, pred_dir = submission
    _write(pred_dir / "res_a.txt", ["0,0,100,0,100,40,0,40"])
    _write(pred_dir / "res_c.txt", ["0,0,10,0,10,10,0,10"])
    with pytest.warns(UserWarning, match=r"res_c\.txt: no ground truth"):
        result = evaluate_folders(gt_dir, pred_dir)
    assert result["unmatched_predictions"] == 1 and result["det_care"] == 1


def test_folders_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        evaluate_folders(tmp_path / "nowhere", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no gt_<name>\.txt"):
        evaluate_folders(tmp_path, tmp_path)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    return subprocess.run(
        [sys.executable, "-m", "vramkit.tasks.text_detection.evaluation.icdar_eval", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=60,
    )


def test_cli_prints_one_json_line(submission) -> None:
    gt_dir, pred_dir = submission
    completed = _run_cli(str(gt_dir), str(pred_dir))
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert {"precision", "recall", "hmean", "matched", "gt_care", "det_care"} <= set(result)
    assert result["recall"] == 0.5 and result["bad_lines"] == 1
    assert "res_a.txt:2" in completed.stderr

    strict = _run_cli(str(gt_dir), str(pred_dir), "--strict")
    assert strict.returncode == 2 and strict.stdout == ""
    assert "res_a.txt:2" in strict.stderr
