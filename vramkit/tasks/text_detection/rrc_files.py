"""ICDAR 2015 files read by the rules of the official RRC evaluation (task 4.1).

The official evaluation is the Robust Reading Competition's ``script.py`` with its
``rrc_evaluation_funcs.py``, run with its default parameters. What it accepts, and how it reads it:

- ground truth and submission are zip files; a ground-truth entry counts when its name matches
  ``gt_img_([0-9]+).txt`` (``re.match``: anchored at the start only) and others are ignored; every
  submission entry must match ``res_img_([0-9]+).txt`` (else "ZIP entry not valid") and name an
  image of the ground truth (else "The sample N not present in GT"). A folder is read the same way
  here, its files standing for the zip's entries. An image without a submission file has no
  detections.
- bytes are decoded as UTF-8 with replacement characters, one leading byte-order mark dropped;
  lines are split at ``\\n`` only and every ``\\r`` is removed; empty lines are skipped.
- a ground-truth line is ``x1,y1,...,x4,y4,transcription``; a submission line ``x1,y1,...,x4,y4``,
  with a confidence column only when the script runs with ``CONFIDENCES`` (default: off). Each
  coordinate must be an integer (``-?[0-9]+``, spaces around allowed): ``12.5`` is refused.
- the four points must be clockwise in image axes (y down): the sum over edges of
  ``(x2 - x1) * (y2 + y1)`` must not be positive. A zero sum (degenerate quads, symmetric bow-ties)
  is accepted.
- a transcription wrapped in double quotes loses them (``\\\\`` and ``\\"`` unescaped); it is a
  don't-care region when it then equals ``###`` exactly: ``" ###"`` and ``"### "`` are not.

A file the script refuses raises :class:`RrcRefusal` with the script's own message. In lenient
mode (``lenient=True``, the command line's ``--lenient``) three refusals become warnings instead:
counter-clockwise points are kept as given (the Polygon library's areas do not depend on the
orientation), non-integer points are truncated toward zero as the script's ``int()`` does once a
line has passed, and an unexpected confidence column is dropped.
"""

from __future__ import annotations

import re
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

GT_NAME = re.compile(r"gt_img_([0-9]+).txt")
SUBMISSION_NAME = re.compile(r"res_img_([0-9]+).txt")
DONT_CARE = "###"

# The script's line patterns. ``\s`` may not cross a line here because the whole text is matched
# at once (MULTILINE): ``[^\S\n]`` is ``\s`` without the newline, which a line cannot contain.
_SPACE = r"[^\S\n]*"
_COORD = _SPACE + r"(-?[0-9]+)" + _SPACE
_COORDS = ",".join([_COORD] * 8)
_CONFIDENCE = r"," + _SPACE + r"([0-1].?[0-9]*)" + _SPACE
_GT_LINE = re.compile(r"^" + _COORDS + r",(.*)$", re.MULTILINE)
_DET_LINE = re.compile(r"^" + _COORDS + r"$", re.MULTILINE)
_DET_LINE_CONFIDENCE = re.compile(r"^" + _COORDS + _CONFIDENCE + r"$", re.MULTILINE)
# Lenient mode: any decimal number as a coordinate, and an optional trailing confidence.
_NUMBER = _SPACE + r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)" + _SPACE
_LENIENT_COORDS = ",".join([_NUMBER] * 8)
_LENIENT_GT_LINE = re.compile(r"^" + _LENIENT_COORDS + r",(.*)$")
_LENIENT_DET_LINE = re.compile(r"^" + _LENIENT_COORDS + r"(?:" + _CONFIDENCE + r")?$")
_QUOTED = re.compile(r'^\s*"(.*)"\s*$')

GT_FORMAT = "Format incorrect. Should be: x1,y1,x2,y2,x3,y3,x4,y4,transcription"
DET_FORMAT = "Format incorrect. Should be: x1,y1,x2,y2,x3,y3,x4,y4"
DET_CONFIDENCE_FORMAT = "Format incorrect. Should be: x1,y1,x2,y2,x3,y3,x4,y4,confidence"
NOT_CLOCKWISE = (
    "Points are not clockwise. The coordinates of bounding quadrilaterals have to be given in "
    "clockwise order. Regarding the correct interpretation of 'clockwise' remember that the "
    "image coordinate system used is the standard one, with the image origin at the upper "
    "left, the X axis extending to the right and Y axis extending downwards."
)
# The script stores points in an int32 array; larger values do not survive there.
_INT32_LIMIT = 2**31


class RrcRefusal(ValueError):
    """Input the official script refuses; the message is the script's reason."""


@dataclass
class SampleQuads:
    """The quads of one file: (n, 4, 2) float64 integer-valued px, and per-quad extras."""

    quads: np.ndarray
    dont_care: np.ndarray  # (n,) bool, ground truth only
    confidences: np.ndarray  # (n,) float64, submissions with confidences only


@dataclass
class LenientNotes:
    """What lenient mode accepted that the official script refuses, counted by kind."""

    counts: Counter = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)  # kind -> first "sample: line" seen

    def add(self, kind: str, where: str, number: int = 1) -> None:
        """Count ``number`` lines of ``kind``; the first place is kept for the warning."""
        self.counts[kind] += number
        self.first.setdefault(kind, where)


def decode(raw: bytes) -> str:
    """The script's ``decode_utf8``: replacement characters, one leading BOM dropped."""
    text = raw.decode("utf-8", "replace")
    return text[1:] if text.startswith("\ufeff") else text


def strip_quotes(transcription: str) -> str:
    """The script's transcription rule: surrounding double quotes removed, escapes undone."""
    quoted = _QUOTED.match(transcription)
    if quoted is None:
        return transcription
    return quoted.group(1).replace("\\\\", "\\").replace('\\"', '"')


def _refusal(sample: str, line: str, error: str) -> RrcRefusal:
    return RrcRefusal(f"Line in sample not valid. Sample: {sample} Line: {line} Error: {error}")


def clockwise_sums(quads: np.ndarray) -> np.ndarray:
    """(n,) the script's orientation sum, sum of (x2 - x1)(y2 + y1); > 0 means not clockwise."""
    x, y = quads[..., 0], quads[..., 1]
    return ((np.roll(x, -1, axis=1) - x) * (np.roll(y, -1, axis=1) + y)).sum(axis=1)


def _strict_lines(text: str, pattern: re.Pattern) -> tuple[list[tuple[str, ...]], list[str]] | None:
    """Every non-empty line matched at once, or None when some line does not match."""
    lines = [line for line in text.split("\n") if line]
    found = pattern.findall(text)
    return (found, lines) if len(found) == len(lines) else None


def parse_sample(
    sample: str,
    raw: bytes,
    *,
    ground_truth: bool,
    confidences: bool = False,
    lenient: bool = False,
    notes: LenientNotes | None = None,
) -> SampleQuads:
    """Read one file by the script's rules; raise :class:`RrcRefusal` as the script does.

    ``sample`` is the image key (the number in ``gt_img_N.txt``), used in messages as the
    script uses it. With ``lenient`` the refusals listed in the module docstring are counted in
    ``notes`` instead.
    """
    text = decode(raw).replace("\r", "")
    if ground_truth:
        pattern, message = _GT_LINE, GT_FORMAT
    elif confidences:
        pattern, message = _DET_LINE_CONFIDENCE, DET_CONFIDENCE_FORMAT
    else:
        pattern, message = _DET_LINE, DET_FORMAT
    parsed = _strict_lines(text, pattern)
    if parsed is not None:
        rows, lines = parsed
        values = np.array([row[:8] for row in rows], dtype=np.float64).reshape(-1, 4, 2)
        extra = [row[8] for row in rows] if len(rows) and len(rows[0]) > 8 else []
    else:
        values, extra, lines = _lines_one_by_one(
            sample, text, pattern, message, ground_truth, confidences, lenient, notes
        )
    if values.size and np.abs(values).max() >= _INT32_LIMIT:
        row = int(np.flatnonzero((np.abs(values) >= _INT32_LIMIT).any(axis=(1, 2)))[0])
        raise _refusal(sample, lines[row], "a coordinate does not fit the script's int32 points")
    counter_clockwise = np.flatnonzero(clockwise_sums(np.trunc(values)) > 0)
    if counter_clockwise.size:
        if not lenient:
            raise _refusal(sample, lines[int(counter_clockwise[0])], NOT_CLOCKWISE)
        if notes is not None:
            where = f"{sample}: {lines[int(counter_clockwise[0])]}"
            notes.add("counter_clockwise", where, int(counter_clockwise.size))
    count = len(values)
    dont_care = np.zeros(count, dtype=bool)
    if ground_truth:
        dont_care = np.array([strip_quotes(t) == DONT_CARE for t in extra], dtype=bool)
    scores = np.zeros(count)
    if confidences and not ground_truth:
        scores = np.zeros(count)
        for row, value in enumerate(extra):
            try:
                scores[row] = float(value)
            except ValueError:
                raise _refusal(sample, lines[row], "Confidence value must be a float") from None
    return SampleQuads(quads=np.trunc(values), dont_care=dont_care, confidences=scores)


def _lines_one_by_one(
    sample: str,
    text: str,
    pattern: re.Pattern,
    message: str,
    ground_truth: bool,
    confidences: bool,
    lenient: bool,
    notes: LenientNotes | None,
) -> tuple[np.ndarray, list[str], list[str]]:
    """The slow path: each line on its own, to name the first refused one or to be lenient."""
    rows: list[list[str]] = []
    extra: list[str] = []
    lines: list[str] = []
    for line in text.split("\n"):
        if not line:
            continue
        match = pattern.fullmatch(line)
        if match is None and lenient:
            lenient_pattern = _LENIENT_GT_LINE if ground_truth else _LENIENT_DET_LINE
            match = lenient_pattern.fullmatch(line)
            if match is not None and notes is not None:
                where = f"{sample}: {line}"
                if not all(re.fullmatch(r"-?[0-9]+", v.strip()) for v in match.groups()[:8]):
                    notes.add("non_integer_points", where)
                if not ground_truth and not confidences and match.group(9) is not None:
                    notes.add("unexpected_confidence", where)
        if match is None:
            raise _refusal(sample, line, message)
        if not lenient:
            # The script checks each line's orientation before it reads the next line.
            points = np.trunc(np.array(match.groups()[:8], dtype=np.float64)).reshape(1, 4, 2)
            if clockwise_sums(points)[0] > 0:
                raise _refusal(sample, line, NOT_CLOCKWISE)
        rows.append(list(match.groups()[:8]))
        lines.append(line)
        if ground_truth or confidences:
            extra.append(match.group(9))
    values = np.array(rows, dtype=np.float64).reshape(-1, 4, 2)
    if confidences and not ground_truth and any(value is None for value in extra):
        raise _refusal(sample, lines[extra.index(None)], message)
    return values, extra, lines


def read_entries(location: str | Path, name_pattern: re.Pattern, *, all_entries: bool) -> dict:
    """The script's ``load_zip_file``: {image key: bytes} for the entries whose name matches.

    ``location`` is a zip file or a folder (its files in sorted order stand for the entries).
    With ``all_entries`` an entry that does not match is refused, as for submissions.
    """
    location = Path(location)
    if location.is_dir():
        entries = [(path.name, path) for path in sorted(location.iterdir()) if path.is_file()]
        read = Path.read_bytes
    elif location.is_file():
        try:
            archive = zipfile.ZipFile(location, mode="r", allowZip64=True)
        except (zipfile.BadZipFile, OSError):
            raise RrcRefusal("Error loading the ZIP archive") from None
        entries = [(name, name) for name in archive.namelist()]

        def read(name: str) -> bytes:
            return archive.read(name)
    else:
        raise FileNotFoundError(f"{location} is neither a zip file nor a folder")
    result: dict[str, bytes] = {}
    for name, handle in entries:
        match = name_pattern.match(name)
        if match is None:
            if all_entries:
                raise RrcRefusal(f"ZIP entry not valid: {name}")
            continue
        key = match.group(1) if match.groups() else name
        result[key] = read(handle)
    return result
