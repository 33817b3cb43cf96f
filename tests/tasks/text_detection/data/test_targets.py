"""DBNet target maps: analytic sizes on a rectangle, and no crash on degenerate polygons."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from vramkit.tasks.text_detection.data.targets import TextTargets, make_targets

HEIGHT, WIDTH = 240, 400


def _rectangle(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def _shrink_distance(width: float, height: float, ratio: float = 0.4) -> float:
    return width * height * (1 - ratio**2) / (2 * (width + height))


def _assert_well_formed(targets: TextTargets, height: int = HEIGHT, width: int = WIDTH) -> None:
    for name, array in targets.as_dict().items():
        assert array.shape == (height, width), name
        assert array.dtype == np.float32, name
        assert np.isfinite(array).all(), name
    for name in ("shrink_map", "shrink_mask", "thresh_mask"):
        assert set(np.unique(getattr(targets, name))) <= {0.0, 1.0}, name
    assert targets.thresh_map.min() >= 0.3 - 1e-6
    assert targets.thresh_map.max() <= 0.7 + 1e-6


def test_shrunk_rectangle_matches_the_offset_distance() -> None:
    targets = make_targets([_rectangle(100, 60, 300, 120)], [False], HEIGHT, WIDTH)
    distance = _shrink_distance(200, 60)
    rows, cols = np.nonzero(targets.shrink_map)
    # Filled pixels span from the first to the last pixel centre inside the shrunk polygon.
    assert abs((cols.max() - cols.min()) - (200 - 2 * distance)) <= 1.0
    assert abs((rows.max() - rows.min()) - (60 - 2 * distance)) <= 1.0
    assert abs(cols.mean() - 200) <= 0.5 and abs(rows.mean() - 90) <= 0.5
    assert targets.shrink_mask.min() == 1.0
    _assert_well_formed(targets)


def test_threshold_map_is_linear_in_the_distance_to_the_border() -> None:
    targets = make_targets([_rectangle(100, 60, 300, 120)], [False], HEIGHT, WIDTH)
    distance = _shrink_distance(200, 60)
    thresh = targets.thresh_map
    assert thresh[60, 200] == pytest.approx(0.7)  # on the top edge
    for offset in (3, 7, 11):
        expected = 0.3 + 0.4 * (1 - offset / distance)
        assert thresh[60 + offset, 200] == pytest.approx(expected, abs=1e-5)  # inside
        assert thresh[60 - offset, 200] == pytest.approx(expected, abs=1e-5)  # outside
    # Corner region: the distance is to the corner point, not to the edge lines.
    assert thresh[55, 95] == pytest.approx(0.3 + 0.4 * (1 - np.hypot(5, 5) / distance), abs=1e-5)
    assert thresh[0, 0] == pytest.approx(0.3)  # background
    assert thresh[90, 200] == pytest.approx(0.3)  # deeper inside than D
    # The mask covers the polygon dilated by D, not more.
    assert targets.thresh_mask[60 - int(distance) + 1, 200] == 1.0
    assert targets.thresh_mask[60 - int(distance) - 2, 200] == 0.0
    assert targets.thresh_mask[90, 200] == 1.0
    _assert_well_formed(targets)


def test_custom_threshold_range_sets_background_and_peak() -> None:
    targets = make_targets(
        [_rectangle(100, 60, 300, 120)], [False], HEIGHT, WIDTH, thresh_min=0.2, thresh_max=0.9
    )
    assert targets.thresh_map.min() == pytest.approx(0.2)
    assert targets.thresh_map.max() == pytest.approx(0.9)


def test_ignored_polygon_is_masked_and_has_no_targets() -> None:
    targets = make_targets([_rectangle(100, 60, 300, 120)], [True], HEIGHT, WIDTH)
    assert targets.shrink_map.max() == 0.0
    assert targets.shrink_mask[60:121, 100:301].max() == 0.0
    assert targets.shrink_mask[0, 0] == 1.0
    assert targets.thresh_mask.max() == 0.0
    assert targets.thresh_map.max() == pytest.approx(0.3)


def test_narrow_text_is_masked_but_keeps_its_border() -> None:
    targets = make_targets([_rectangle(100, 60, 300, 65)], [False], HEIGHT, WIDTH)
    assert targets.shrink_map.max() == 0.0
    assert targets.shrink_mask[62, 200] == 0.0
    assert targets.thresh_mask[62, 200] == 1.0
    assert targets.thresh_map.max() > 0.6


def test_rotated_narrow_text_uses_the_minimum_area_rectangle() -> None:
    # A 200 x 6 px bar at 45°: its axis-aligned box is wide, its real width is 6 px.
    angle = np.pi / 4
    direction = np.array([np.cos(angle), np.sin(angle)])
    normal = np.array([-np.sin(angle), np.cos(angle)])
    centre = np.array([200.0, 120.0])
    bar = np.array(
        [
            centre + a * 100 * direction + b * 3 * normal
            for a, b in ((-1, -1), (1, -1), (1, 1), (-1, 1))
        ]
    )
    assert make_targets([bar], [False], HEIGHT, WIDTH).shrink_map.max() == 0.0
    assert make_targets([bar], [False], HEIGHT, WIDTH, min_text_size=5).shrink_map.max() == 1.0


def test_shrink_that_splits_fills_every_piece() -> None:
    # Two 40 px squares joined by a 2 px bridge: shrinking by D ≈ 7 px cuts the bridge.
    dumbbell = np.array(
        [
            [50, 50],
            [90, 50],
            [90, 69],
            [120, 69],
            [120, 50],
            [160, 50],
            [160, 90],
            [120, 90],
            [120, 71],
            [90, 71],
            [90, 90],
            [50, 90],
        ],
        dtype=np.float64,
    )
    targets = make_targets([dumbbell], [False], HEIGHT, WIDTH)
    pieces, _ = cv2.connectedComponents(targets.shrink_map.astype(np.uint8))
    assert pieces - 1 == 2
    assert targets.shrink_map[70, 70] == 1.0 and targets.shrink_map[70, 140] == 1.0
    assert targets.shrink_map[70, 105] == 0.0
    _assert_well_formed(targets)


def test_shrink_that_vanishes_masks_the_polygon() -> None:
    # Area 1.5 px² spread over 1000 px: the shrunk polygon is empty at 1/256 px resolution.
    sliver = _rectangle(10, 100, 1010, 100.0015)
    targets = make_targets([sliver], [False], HEIGHT, WIDTH, min_text_size=0)
    assert targets.shrink_map.max() == 0.0
    assert targets.shrink_mask[100, 50] == 0.0
    _assert_well_formed(targets)


DEGENERATE = {
    "zero area (collinear)": np.array([[10, 10], [50, 10], [90, 10], [30, 10]], dtype=float),
    "repeated points": np.array([[40, 40]] * 4, dtype=float),
    "repeated vertex": np.array([[40, 40], [140, 40], [140, 40], [140, 80], [40, 80]], float),
    "bow-tie": np.array([[50, 50], [150, 100], [150, 50], [50, 100]], dtype=float),
    "lopsided bow-tie": np.array([[50, 50], [250, 120], [250, 50], [50, 60]], dtype=float),
    "U shape": np.array(
        [[50, 50], [70, 50], [70, 150], [130, 150], [130, 50], [150, 50], [150, 170], [50, 170]],
        dtype=float,
    ),
    "partly outside": _rectangle(-50, -20, 80, 40),
    "fully outside": _rectangle(-500, -300, -400, -250),
    "far outside": _rectangle(1e7, 1e7, 1e7 + 100, 1e7 + 40),
    "covering everything": _rectangle(-1e8, -1e8, 1e8, 1e8),
    "beyond any image": _rectangle(-1e12, 10, 1e12, 60),
    "NaN coordinate": np.array([[10, 10], [np.nan, 10], [90, 60], [10, 60]], dtype=float),
    "infinite coordinate": np.array([[10, 10], [np.inf, 10], [90, 60], [10, 60]], dtype=float),
    "two points": np.array([[10, 10], [90, 60]], dtype=float),
    "one point": np.array([[10, 10]], dtype=float),
    "no points": np.zeros((0, 2)),
    "tiny triangle": np.array([[10, 10], [11.5, 10], [10, 11.5]], dtype=float),
}


@pytest.mark.parametrize("ignored", [False, True])
@pytest.mark.parametrize("name", list(DEGENERATE))
def test_degenerate_polygon_gives_well_formed_targets(name: str, ignored: bool) -> None:
    good = _rectangle(200, 150, 360, 200)
    targets = make_targets([DEGENERATE[name], good], [ignored, False], HEIGHT, WIDTH)
    _assert_well_formed(targets)
    # A broken neighbour never costs the good polygon its targets (an ignored region that
    # covers the good polygon does mask it: ignoring wins).
    assert targets.shrink_map[175, 280] == 1.0
    covered = ignored and name == "covering everything"
    assert targets.shrink_mask[175, 280] == (0.0 if covered else 1.0)


def test_nan_polygon_keeps_the_loss_off_its_located_part() -> None:
    polygon = np.array([[10, 10], [90, 10], [90, 60], [np.nan, 60], [10, 60]], dtype=float)
    targets = make_targets([polygon], [False], HEIGHT, WIDTH)
    assert targets.shrink_map.max() == 0.0
    assert targets.shrink_mask[30, 50] == 0.0


def test_no_polygons_gives_background_everywhere() -> None:
    targets = make_targets([], [], HEIGHT, WIDTH)
    assert targets.shrink_map.max() == 0.0 and targets.shrink_mask.min() == 1.0
    assert targets.thresh_mask.max() == 0.0
    assert np.allclose(targets.thresh_map, 0.3)


def test_overlapping_polygons_take_the_closest_border() -> None:
    first, second = _rectangle(100, 60, 300, 120), _rectangle(150, 80, 350, 140)
    both = make_targets([first, second], [False, False], HEIGHT, WIDTH)
    alone = [make_targets([p], [False], HEIGHT, WIDTH) for p in (first, second)]
    assert np.allclose(both.thresh_map, np.maximum(alone[0].thresh_map, alone[1].thresh_map))
    assert np.array_equal(both.thresh_mask, np.maximum(alone[0].thresh_mask, alone[1].thresh_mask))


def test_bad_arguments_raise_with_the_culprit_named() -> None:
    with pytest.raises(ValueError, match="polygon 1 has shape"):
        make_targets([_rectangle(0, 0, 10, 10), np.zeros(8)], [False, False], HEIGHT, WIDTH)
    with pytest.raises(ValueError, match="2 polygons but 1 ignore flags"):
        make_targets([_rectangle(0, 0, 10, 10)] * 2, [False], HEIGHT, WIDTH)
    with pytest.raises(ValueError, match="image size"):
        make_targets([], [], 0, WIDTH)
