"""Reading and writing the ICDAR 2015 text files (ground truth and submissions).

Ground truth: ``gt_<name>.txt``, one instance per line, ``x1,y1,x2,y2,x3,y3,x4,y4,transcription``,
UTF-8 with or without a byte-order mark, LF or CRLF. The transcription may itself contain commas,
hence ``split(",", 8)``. ``###`` marks a do-not-care region.

Submission: ``res_<name>.txt``, ``x1,y1,...,x4,y4`` per line with an optional trailing confidence.

A malformed line never crashes a reader: it is reported as a :class:`BadLine` (file, line number,
reason) so the caller can warn and count it, or refuse it in strict mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vramkit.core.data.bad_lines import AnnotationError, BadLine

DONT_CARE = "###"


@dataclass
class Annotation:
    """The text instances of one image, in pixel coordinates of the original image."""

    polygons: list[np.ndarray] = field(default_factory=list)  # each (4, 2) float32
    ignore: list[bool] = field(default_factory=list)  # True for ``###`` (do-not-care)
    texts: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # 1-based line number of each instance
    bad_lines: list[BadLine] = field(default_factory=list)


def _read_lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        # One undecodable byte must not cost the whole file: the line that held it carries a
        # replacement character, and the parser reports that line alone.
        text = raw.decode("utf-8-sig", errors="replace")
    return text.splitlines()


def _parse_coords(fields: list[str]) -> np.ndarray:
    values = [float(v) for v in fields]
    if not all(math.isfinite(v) for v in values):
        raise ValueError("coordinate is not finite")
    return np.asarray(values, dtype=np.float32).reshape(-1, 2)


def read_ground_truth(path: str | Path, *, strict: bool = False) -> Annotation:
    """Parse one ``gt_<name>.txt`` file.

    Malformed lines (too few fields, non-numeric coordinates, undecodable bytes) are collected in
    ``Annotation.bad_lines``; with ``strict=True`` the first one raises :class:`AnnotationError`.
    """
    path = Path(path)
    annotation = Annotation()
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        problem = None
        parts = line.split(",", 8)
        if "\ufffd" in line:
            problem = "bytes that are not UTF-8"
        elif len(parts) < 8:
            problem = f"expected 8 coordinates and a transcription, found {len(parts)} fields"
        else:
            try:
                polygon = _parse_coords(parts[:8])
            except ValueError as error:
                problem = f"bad coordinate ({error})"
        if problem is not None:
            bad = BadLine(path, number, problem)
            if strict:
                raise AnnotationError(str(bad))
            annotation.bad_lines.append(bad)
            continue
        text = parts[8].strip() if len(parts) > 8 else ""
        annotation.polygons.append(polygon)
        annotation.ignore.append(text == DONT_CARE)
        annotation.texts.append(text)
        annotation.lines.append(number)
    return annotation


def read_detections(path: str | Path, *, strict: bool = False) -> Annotation:
    """Parse one ``res_<name>.txt`` submission file; a trailing confidence is allowed and dropped.

    A missing file means no detections, as the ICDAR 2015 protocol says.
    """
    path = Path(path)
    annotation = Annotation()
    if not path.exists():
        return annotation
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) not in (8, 9):
                raise ValueError(
                    f"expected 8 coordinates and an optional confidence, found {len(parts)} fields"
                )
            polygon = _parse_coords(parts[:8])
        except ValueError as error:
            bad = BadLine(path, number, str(error))
            if strict:
                raise AnnotationError(str(bad)) from error
            annotation.bad_lines.append(bad)
            continue
        annotation.polygons.append(polygon)
        annotation.ignore.append(False)
        annotation.texts.append("")
        annotation.lines.append(number)
    return annotation


def _format_coords(polygon: np.ndarray) -> str:
    return ",".join(str(round(float(v))) for v in np.asarray(polygon).reshape(-1))


def write_ground_truth(path: str | Path, polygons: list[np.ndarray], texts: list[str]) -> None:
    """Write a ``gt_<name>.txt`` file (UTF-8 with BOM, as the official release has it)."""
    lines = []
    for polygon, text in zip(polygons, texts, strict=True):
        lines.append(f"{_format_coords(polygon)},{text}")
    Path(path).write_text("\ufeff" + "\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")


def write_detections(
    path: str | Path, polygons: list[np.ndarray], scores: list[float] | None = None
) -> None:
    """Write a ``res_<name>.txt`` submission file, integer coordinates, optional confidence."""
    lines = []
    for index, polygon in enumerate(polygons):
        coords = _format_coords(polygon)
        if scores is not None:
            coords += f",{scores[index]:.4f}"
        lines.append(coords)
    Path(path).write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
