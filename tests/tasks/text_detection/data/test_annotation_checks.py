"""Every geometry problem of a ground-truth line is found, named with file and line, counted and
repaired as DB's data pipeline does (clip, area under 1 px² as don't-care) or as documented."""

import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from vramkit.core.data.bad_lines import AnnotationError
from vramkit.tasks.text_detection.data.annotation_checks import (
    CLIPPED,
    DONT_CARE_KIND,
    DUPLICATE,
    LONG_TEXT,
    REORDERED,
    check_annotation,
)
from vramkit.tasks.text_detection.data.icdar_folder import TextDetectionDataset
from vramkit.tasks.text_detection.data.icdar_format import read_ground_truth

GOOD = "10,10,60,10,60,30,10,30,word"


def _check(tmp_path: Path, *lines: str, size=(100, 200), strict=False):
    path = tmp_path / "gt_img_1.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return check_annotation(read_ground_truth(path), path, size, strict=strict)


def _kinds(checked) -> list[tuple[str, int]]:
    return [(kind, bad.line_number) for kind, bad in checked.findings]


def test_a_clean_file_has_no_findings_and_keeps_its_quads(tmp_path):
    checked = _check(tmp_path, GOOD, "70,10,90,10,90,30,70,30,###")
    assert checked.findings == [] and checked.ignore == [False, True]
    np.testing.assert_array_equal(checked.polygons[0], [[10, 10], [60, 10], [60, 30], [10, 30]])


def test_a_bow_tie_is_reordered_into_the_quad_its_corners_make(tmp_path):
    checked = _check(tmp_path, GOOD, "10,50,60,70,60,50,10,70,bowtie")
    assert _kinds(checked) == [(REORDERED, 2)]
    quad = checked.polygons[1]
    assert cv2.contourArea(quad) == pytest.approx(50 * 20)
    assert checked.ignore == [False, False]


def test_zero_area_and_outside_quads_become_dont_care_partly_outside_ones_are_clipped(tmp_path):
    checked = _check(
        tmp_path,
        "5,5,40,5,40,5,5,5,flat",  # zero area
        "300,10,350,10,350,30,300,30,gone",  # right of a 200-px-wide image
        "180,10,260,10,260,30,180,30,edge",  # partly outside
    )
    assert _kinds(checked) == [(DONT_CARE_KIND, 1), (DONT_CARE_KIND, 2), (CLIPPED, 3)]
    assert checked.ignore == [True, True, False]
    assert checked.polygons[2][:, 0].max() == 199  # DB clips to w - 1


def test_a_duplicate_quad_is_left_out_once(tmp_path):
    checked = _check(tmp_path, GOOD, GOOD, GOOD)
    assert _kinds(checked) == [(DUPLICATE, 2), (DUPLICATE, 3)]
    assert len(checked.polygons) == 1


def test_a_many_point_line_is_its_rectangle_as_dont_care_and_a_long_text_is_counted(tmp_path):
    angles = np.linspace(0, 2 * np.pi, 1500, endpoint=False)
    ring = np.stack([100 + 50 * np.cos(angles), 50 + 20 * np.sin(angles)], axis=1).round()
    many = ",".join(str(int(v)) for v in ring.ravel()) + ",circle"
    checked = _check(tmp_path, many, "10,40,60,40,60,60,10,60," + "x" * 23978)
    assert _kinds(checked) == [(DONT_CARE_KIND, 1), (LONG_TEXT, 2)]
    assert "1500 points" in str(checked.findings[0][1])
    box = checked.polygons[0]
    assert box[:, 0].min() == pytest.approx(50, abs=1) and box[:, 0].max() == pytest.approx(150)
    assert checked.ignore == [True, False]


def test_strict_mode_names_the_first_problem_with_file_and_line(tmp_path):
    with pytest.raises(AnnotationError, match=r"gt_img_1\.txt:2: a self-intersecting quad"):
        _check(tmp_path, GOOD, "10,50,60,70,60,50,10,70,bowtie", GOOD, strict=True)


def test_the_dataset_warns_counts_and_trains_on_the_repaired_quads(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "gt").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "img_1.png"), np.zeros((100, 200, 3), np.uint8))
    (tmp_path / "gt" / "gt_img_1.txt").write_text(
        f"{GOOD}\n{GOOD}\n10,50,60,70,60,50,10,70,bowtie\n180,10,260,10,260,30,180,30,edge\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = TextDetectionDataset(tmp_path, transform=None)
    messages = [str(w.message) for w in caught]
    assert any("gt_img_1.txt:2: the same quad" in m for m in messages), messages
    assert dataset.problems() == {
        "bad_lines": 0,
        "missing_gt": 0,
        "orphan_gt": 0,
        "geometry_duplicate": 1,
        "geometry_reordered": 1,
        "geometry_clipped": 1,
    }
    assert len(dataset.polygons[0]) == 3
    assert dataset[0]["shrink_map"].sum() > 0
