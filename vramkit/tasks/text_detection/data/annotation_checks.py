"""Geometry checks of training and validation annotations, with the repair each problem gets.

A ground-truth line can parse and still be wrong: a bow-tie quad (corners in the wrong order), a
zero-area or out-of-image quad, the same quad twice, a polygon of thousands of points squeezed
into the 8-coordinate format (its extra coordinates end up in the transcription), a transcription
of thousands of characters. Each is warned about with file and line, counted, and repaired the
way DBNet's own training data pipeline does where it has a rule (MhLiao/DB,
``data/processes/make_seg_detection_data.py``, ``validate_polygons``: coordinates clipped to the
image, a quad of area under 1 px² kept as don't-care); otherwise as said per problem below. In
strict mode the first problem is an `AnnotationError` naming file and line.

What evaluation counts is not changed here: the official ICDAR 2015 script reads the files as they
are (`icdar_eval`); these checks only decide what the model is trained and validated against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vramkit.core.data.bad_lines import AnnotationError, BadLine
from vramkit.tasks.text_detection.data.icdar_format import Annotation
from vramkit.tasks.text_detection.data.polygon_geometry import min_area_rect, order_clockwise

MIN_AREA_PX2 = 1.0
"""A quad of smaller area (px²) marks no text pixel; DB keeps it as don't-care."""
MAX_TRANSCRIPTION_CHARS = 128
"""ICDAR 2015 annotates single words; a transcription longer than this is a broken line."""

_LEADING_NUMBERS = re.compile(r"^\s*-?\d+(?:\.\d+)?\s*,\s*-?\d+(?:\.\d+)?\s*(?:,|$)")

# Kinds of problem, as counted in the dataset's problems() (``geometry_<kind>``).
REORDERED = "reordered"
DONT_CARE_KIND = "dont_care"
CLIPPED = "clipped"
DUPLICATE = "duplicate"
LONG_TEXT = "long_transcription"


@dataclass
class CheckedAnnotation:
    """The instances to train on, and what was found (one `BadLine` per problem)."""

    polygons: list[np.ndarray] = field(default_factory=list)
    ignore: list[bool] = field(default_factory=list)
    findings: list[tuple[str, BadLine]] = field(default_factory=list)
    """(kind, where and what) for every problem, in line order."""


def check_annotation(
    annotation: Annotation,
    path: Path,
    image_size: tuple[int, int] | None,
    *,
    strict: bool = False,
) -> CheckedAnnotation:
    """Check and repair the instances of one ground-truth file.

    ``image_size`` is (height, width) in px, or None when the image could not be measured (then
    nothing is clipped). Returns the repaired polygons ((4, 2) float32) and don't-care flags.
    """
    checked = CheckedAnnotation()
    seen: set[bytes] = set()

    def found(kind: str, line: int, problem: str) -> None:
        bad = BadLine(path, line, problem)
        if strict:
            raise AnnotationError(str(bad))
        checked.findings.append((kind, bad))

    for polygon, ignore, text, line in zip(
        annotation.polygons, annotation.ignore, annotation.texts, annotation.lines, strict=True
    ):
        polygon = polygon.astype(np.float32, copy=True)
        extra = _extra_points(text)
        if extra is not None:
            found(
                DONT_CARE_KIND,
                line,
                f"the line holds {4 + len(extra)} points, a quad has 4 (the rest was read as its "
                "transcription); kept as don't-care, by its minimum-area rectangle",
            )
            corners, _ = min_area_rect(np.concatenate([polygon, extra]))
            polygon, ignore = order_clockwise(corners).astype(np.float32), True
        elif len(text) > MAX_TRANSCRIPTION_CHARS:
            found(
                LONG_TEXT,
                line,
                f"a transcription of {len(text)} characters (over {MAX_TRANSCRIPTION_CHARS}); "
                "the quad is kept",
            )
        if _self_intersecting(polygon):
            corners = order_clockwise(polygon)
            if _self_intersecting(corners) or abs(_area(corners)) < MIN_AREA_PX2:
                found(DONT_CARE_KIND, line, "a self-intersecting quad; kept as don't-care")
                ignore = True
            else:
                found(REORDERED, line, "a self-intersecting quad; its corners were reordered")
                polygon = corners.astype(np.float32)
        if image_size is not None:
            height, width = image_size
            clipped = polygon.copy()
            clipped[:, 0] = np.clip(clipped[:, 0], 0, width - 1)
            clipped[:, 1] = np.clip(clipped[:, 1], 0, height - 1)
            if not np.array_equal(clipped, polygon):
                outside = abs(_area(clipped)) < MIN_AREA_PX2
                where, action = ("outside", "don't-care") if outside else ("partly outside", "")
                found(
                    DONT_CARE_KIND if outside else CLIPPED,
                    line,
                    f"a quad {where} the {width}x{height} image; "
                    + (f"kept as {action}" if outside else "clipped to the image"),
                )
                polygon, ignore = clipped, ignore or outside
        if abs(_area(polygon)) < MIN_AREA_PX2 and not ignore:
            found(DONT_CARE_KIND, line, "a quad of zero area; kept as don't-care")
            ignore = True
        key = polygon.tobytes()
        if key in seen:
            found(DUPLICATE, line, "the same quad as an earlier line; left out")
            continue
        seen.add(key)
        checked.polygons.append(polygon)
        checked.ignore.append(ignore)
    return checked


def _extra_points(text: str) -> np.ndarray | None:
    """The coordinates a transcription starts with, as (n, 2) points, when it starts with some."""
    if not _LEADING_NUMBERS.match(text):
        return None
    fields = text.split(",")
    values = []
    for value in fields:
        try:
            values.append(float(value))
        except ValueError:
            break
    pairs = len(values) // 2
    return np.asarray(values[: 2 * pairs], dtype=np.float32).reshape(pairs, 2)


def _area(polygon: np.ndarray) -> float:
    x, y = polygon[:, 0].astype(np.float64), polygon[:, 1].astype(np.float64)
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def _self_intersecting(quad: np.ndarray) -> bool:
    """Whether opposite edges of a quad cross (a bow-tie)."""
    a, b, c, d = quad.astype(np.float64)
    return _segments_cross(a, b, c, d) or _segments_cross(b, c, d, a)


def _segments_cross(p: np.ndarray, q: np.ndarray, r: np.ndarray, s: np.ndarray) -> bool:
    def side(o: np.ndarray, u: np.ndarray, v: np.ndarray) -> float:
        return float((u[0] - o[0]) * (v[1] - o[1]) - (u[1] - o[1]) * (v[0] - o[0]))

    return side(p, q, r) * side(p, q, s) < 0 and side(r, s, p) * side(r, s, q) < 0
