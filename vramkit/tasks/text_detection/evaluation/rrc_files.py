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

import functools
import re
import struct
import zipfile
import zlib
from collections import Counter
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
_GT_LINE = r"^" + _COORDS + r",(.*)$"
_DET_LINE = r"^" + _COORDS + r"$"
_DET_LINE_CONFIDENCE = r"^" + _COORDS + _CONFIDENCE + r"$"
# The same patterns with the eight coordinates in one group, for the fast path: one findall
# per file and one numeric conversion of all its coordinates.
_ONE_COORD = _SPACE + r"-?[0-9]+" + _SPACE
_COORD_BLOCK = r"(" + ",".join([_ONE_COORD] * 8) + r")"
_FAST = {
    "gt": r"^" + _COORD_BLOCK + r",(.*)$",
    "det": r"^" + _COORD_BLOCK + r"()$",
    "det_confidence": r"^" + _COORD_BLOCK + _CONFIDENCE + r"$",
}
# Lenient mode: any decimal number as a coordinate, and an optional trailing confidence.
_NUMBER = _SPACE + r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)" + _SPACE
_LENIENT_COORDS = ",".join([_NUMBER] * 8)
_LENIENT_GT_LINE = r"^" + _LENIENT_COORDS + r",(.*)$"
_LENIENT_DET_LINE = r"^" + _LENIENT_COORDS + r"(?:" + _CONFIDENCE + r")?$"
_QUOTED = r'^\s*"(.*)"\s*$'


@functools.cache
def _compiled(pattern: str) -> re.Pattern:
    """Patterns are compiled on first use: most runs read every line with array operations and
    never need them, and compiling them all costs more than a tenth of such a run."""
    return re.compile(pattern, re.MULTILINE)


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


class SampleQuads:
    """The quads of one file: (n, 4, 2) float64 integer-valued px, and per-quad extras."""

    def __init__(self, quads: np.ndarray, dont_care: np.ndarray, confidences: np.ndarray) -> None:
        self.quads = quads
        self.dont_care = dont_care  # (n,) bool, ground truth only
        self.confidences = confidences  # (n,) float64, submissions with confidences only


class LenientNotes:
    """What lenient mode accepted that the official script refuses, counted by kind."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.first: dict[str, str] = {}  # kind -> first "sample: line" seen

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
    quoted = _compiled(_QUOTED).match(transcription)
    if quoted is None:
        return transcription
    return quoted.group(1).replace("\\\\", "\\").replace('\\"', '"')


def _refusal(sample: str, line: str, error: str) -> RrcRefusal:
    return RrcRefusal(f"Line in sample not valid. Sample: {sample} Line: {line} Error: {error}")


def clockwise_sums(quads: np.ndarray) -> np.ndarray:
    """(n,) the script's orientation sum, sum of (x2 - x1)(y2 + y1); > 0 means not clockwise."""
    x, y = quads[..., 0], quads[..., 1]
    total = (x[..., 0] - x[..., 3]) * (y[..., 0] + y[..., 3])
    for i in range(3):  # element-wise: a sum over an axis of length 4 is slower in numpy
        total = total + (x[..., i + 1] - x[..., i]) * (y[..., i + 1] + y[..., i])
    return total


def _fast_lines(text: str, kind: str) -> tuple[str, list[str], list[str]] | None:
    """(coordinates joined by commas, last column, lines) when every non-empty line passes."""
    lines = [line for line in text.split("\n") if line]
    found = _compiled(_FAST[kind]).findall(text)
    if len(found) != len(lines):
        return None
    if not found:
        return "", [], lines
    coordinates, extra = zip(*found, strict=True)
    return ",".join(coordinates), list(extra), lines


_INTEGER_CHARACTERS = r"[-0-9,]*"
_LONGEST_INTEGER = 10  # digits; longer numbers exceed int32 and take the general path


def _comma_separated_integers(joined: str) -> np.ndarray | None:
    """Parse ``"12,-3,4"`` into float64 values with a few array passes; None if not that simple.

    Converting strings one by one costs more than all the line matching, so the numbers are
    read digit column by digit column (Horner's rule, right-aligned). Whitespace and numbers of
    more than 10 digits take the general path.
    """
    if not _compiled(_INTEGER_CHARACTERS).fullmatch(joined):
        return None
    data = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    separators = np.flatnonzero(data == ord(","))
    starts = np.concatenate(([0], separators + 1))
    ends = np.concatenate((separators, [data.size]))
    return _integers_between(data, starts, ends)


def _numbers(joined: str) -> np.ndarray:
    if not joined:
        return np.zeros(0)
    values = _comma_separated_integers(joined)
    if values is None:
        values = np.array("".join(joined.split()).split(","), dtype=np.float64)
    return values


def _is_dont_care(transcription: str) -> bool:
    if transcription == DONT_CARE:
        return True
    # Unescaping cannot make a '#', so a quoted ### must hold the quoted string verbatim.
    return '"###"' in transcription and strip_quotes(transcription) == DONT_CARE


class _Parsed:
    def __init__(
        self,
        key: str,
        values: np.ndarray,
        extra: list[str] | None,
        text: str,
        dont_care: np.ndarray | None = None,
    ) -> None:
        self.key = key
        self.values = values  # (n, 4, 2)
        self.extra = extra  # last column per line (transcription or confidence)
        self.text = text
        self.dont_care = dont_care  # ground truth read all at once: flags, not texts

    @property
    def lines(self) -> list[str]:
        """The file's non-empty lines, for messages."""
        return [line for line in self.text.split("\n") if line]


_COORDINATE_BYTES = np.zeros(256, dtype=bool)
_COORDINATE_BYTES[list(b"0123456789,-")] = True


def _all_lines_at_once(
    texts: list[str], ground_truth: bool
) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """Every file's quads (and ``###`` flags) from one pass over all their bytes, or None.

    The common case, lines of eight plain integers (and a transcription after the eighth comma
    in ground truth), is checked with array operations on the bytes: each coordinate field is
    ``-?[0-9]+``, the line has exactly 7 commas (submission) or at least 8 (ground truth). Any
    other line (spaces, a wrong field, a refusal to report) returns None and the files are read
    line by line with the script's patterns instead.
    """
    if not texts:
        return [], []
    data = np.frombuffer(("\n".join(texts) + "\n").encode("utf-8"), dtype=np.uint8)
    is_newline = data == ord("\n")
    newline = np.flatnonzero(is_newline)
    line_start = np.concatenate(([0], newline[:-1] + 1))
    nonempty = newline > line_start
    comma_at = np.flatnonzero(data == ord(","))
    comma_line = np.cumsum(is_newline, dtype=np.int32)[comma_at]
    commas = np.bincount(comma_line, minlength=newline.size)
    rank = np.arange(comma_at.size) - (np.cumsum(commas) - commas)[comma_line]
    coordinate_end = newline.copy()
    if ground_truth:
        if (commas[nonempty] < 8).any():
            return None
        coordinate_end[comma_line[rank == 7]] = comma_at[rank == 7]
    elif (commas[nonempty] != 7).any():
        return None
    starts, ends = line_start[nonempty], coordinate_end[nonempty]
    marks = np.zeros(data.size + 1, dtype=np.int8)
    marks[starts] = 1
    marks[ends] = -1
    in_field = np.cumsum(marks[:-1], dtype=np.int8) > 0
    field_bytes = data[in_field]
    if not _COORDINATE_BYTES[field_bytes].all():
        return None
    # The fields are split at their first 7 commas, so each field is -?[0-9]+ when it is not
    # empty, a minus sign can only lead it, and a leading minus has a digit after it.
    inner = comma_at[rank < 7].reshape(-1, 7)
    token_end = np.concatenate([inner, ends[:, None]], axis=1).reshape(-1)
    token_start = np.concatenate([starts[:, None], inner + 1], axis=1).reshape(-1)
    leading_minus = data[np.minimum(token_start, data.size - 1)] == ord("-")
    if (token_end - token_start - leading_minus < 1).any():
        return None
    if int((field_bytes == ord("-")).sum()) != int(leading_minus.sum()):
        return None
    values = _integers_between(data, token_start, token_end)
    if values is None:
        return None
    values = values.reshape(-1, 4, 2)
    file_of_line = np.repeat(np.arange(len(texts)), [text.count("\n") + 1 for text in texts])
    per_file = np.bincount(file_of_line[nonempty], minlength=len(texts))
    split_at = np.cumsum(per_file)[:-1]
    dont_care = np.zeros(len(values), dtype=bool)
    if ground_truth:
        text_start, text_end = ends + 1, newline[nonempty]
        three = np.flatnonzero(text_end - text_start == 3)
        hashes = data[text_start[three, None] + np.arange(3)] == ord("#")
        dont_care[three[hashes.all(axis=1)]] = True
        # '"###"' anywhere in a transcription: exactly that is don't-care; the rest (quotes with
        # spaces around) goes through the script's quote rule one by one.
        quoted = data[:-4] == ord('"')
        for offset, byte in enumerate(b'###"', start=1):
            quoted &= data[offset : data.size - 4 + offset] == byte
        found = np.flatnonzero(quoted)
        rows = np.searchsorted(text_end, found)
        inside = text_start[rows] <= found
        for row in sorted(set(rows[inside].tolist())):
            if text_end[row] - text_start[row] == 5:
                dont_care[row] = True
            else:
                text = data[text_start[row] : text_end[row]].tobytes().decode("utf-8")
                dont_care[row] = _is_dont_care(text)
    return np.split(values, split_at), np.split(dont_care, split_at)


def _integers_between(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """Values of the ``-?[0-9]+`` fields ``data[starts[i]:ends[i]]`` (digit columns, Horner)."""
    # a trailing empty field starts at len(data): read its (absent) sign from the last byte
    first_digit = starts + (data[np.minimum(starts, data.size - 1)] == ord("-"))
    longest = int((ends - first_digit).max(initial=0))
    if longest > _LONGEST_INTEGER:
        return None
    values = np.zeros(starts.size)
    for column in range(longest):
        position = ends - longest + column
        present = position >= first_digit
        digit = data[np.maximum(position, 0)] - ord("0")
        values = np.where(present, values * 10.0 + digit, values)
    return np.where(first_digit > starts, -values, values)


def _check_and_build(
    parsed: list[_Parsed],
    ground_truth: bool,
    confidences: bool,
    lenient: bool,
    notes: LenientNotes | None,
) -> dict[str, SampleQuads]:
    """The int32 and clockwise checks of files in order (all lines at once), then their quads."""
    if not parsed:
        return {}
    values = np.concatenate([item.values for item in parsed])
    owner = np.repeat(np.arange(len(parsed)), [len(item.values) for item in parsed])
    first_row = np.cumsum([len(item.values) for item in parsed]) - [
        len(item.values) for item in parsed
    ]
    too_large = np.flatnonzero((np.abs(values) >= _INT32_LIMIT).any(axis=(1, 2)))
    quads = np.trunc(values)
    counter_clockwise = np.flatnonzero(clockwise_sums(quads) > 0)
    if too_large.size:
        row = int(too_large[0])
        item = parsed[owner[row]]
        if lenient or not counter_clockwise.size or counter_clockwise[0] > row:
            line = item.lines[row - first_row[owner[row]]]
            raise _refusal(item.key, line, "a coordinate does not fit the script's int32 points")
    if counter_clockwise.size:
        row = int(counter_clockwise[0])
        item = parsed[owner[row]]
        line = item.lines[row - first_row[owner[row]]]
        if not lenient:
            raise _refusal(item.key, line, NOT_CLOCKWISE)
        if notes is not None:
            notes.add("counter_clockwise", f"{item.key}: {line}", int(counter_clockwise.size))
    result = {}
    for index, item in enumerate(parsed):
        rows = slice(first_row[index], first_row[index] + len(item.values))
        count = len(item.values)
        dont_care = np.zeros(count, dtype=bool)
        if item.dont_care is not None:
            dont_care = item.dont_care
        elif ground_truth:
            dont_care = np.array([_is_dont_care(text) for text in item.extra], dtype=bool)
        scores = np.zeros(count)
        if confidences and not ground_truth:
            for row, value in enumerate(item.extra):
                try:
                    scores[row] = float(value)
                except ValueError:
                    error = "Confidence value must be a float"
                    raise _refusal(item.key, item.lines[row], error) from None
        result[item.key] = SampleQuads(quads=quads[rows], dont_care=dont_care, confidences=scores)
    return result


def parse_samples(
    entries: dict[str, bytes],
    *,
    ground_truth: bool,
    confidences: bool = False,
    lenient: bool = False,
    notes: LenientNotes | None = None,
) -> dict[str, SampleQuads]:
    """Read files by the script's rules, in order; raise :class:`RrcRefusal` as the script does.

    ``entries`` maps the image key (the number in ``gt_img_N.txt``, used in messages as the
    script uses it) to the file's bytes. The refusal is the one the script gives first, going
    through the files and their lines in order. With ``lenient`` the refusals listed in the
    module docstring are counted in ``notes`` instead.
    """
    if ground_truth:
        kind, pattern, message = "gt", _GT_LINE, GT_FORMAT
    elif confidences:
        kind, pattern, message = "det_confidence", _DET_LINE_CONFIDENCE, DET_CONFIDENCE_FORMAT
    else:
        kind, pattern, message = "det", _DET_LINE, DET_FORMAT
    texts = [decode(raw).replace("\r", "") for raw in entries.values()]
    if not confidences:
        at_once = _all_lines_at_once(texts, ground_truth)
        if at_once is not None:
            parsed = [
                _Parsed(key, values, None, text, flags)
                for key, text, values, flags in zip(entries, texts, *at_once, strict=True)
            ]
            return _check_and_build(parsed, ground_truth, confidences, lenient, notes)
    result: dict[str, SampleQuads] = {}
    pending: list[tuple[str, str, list[str], str, int]] = []

    def settle() -> None:
        numbers = _numbers(",".join(item[1] for item in pending if item[1]))
        numbers = numbers.reshape(-1, 4, 2)
        parsed, start = [], 0
        for key, _, extra, text, count in pending:
            parsed.append(_Parsed(key, numbers[start : start + count], extra, text))
            start += count
        result.update(_check_and_build(parsed, ground_truth, confidences, lenient, notes))
        pending.clear()

    for key, text in zip(entries, texts, strict=True):
        fast = _fast_lines(text, kind)
        if fast is not None:
            joined, extra, lines = fast
            pending.append((key, joined, extra, text, len(lines)))
            continue
        settle()  # the files before this one are checked first, as the script goes in order
        values, extra, lines = _lines_one_by_one(
            key, text, pattern, message, ground_truth, confidences, lenient, notes
        )
        parsed = [_Parsed(key, values, extra, text)]
        result.update(_check_and_build(parsed, ground_truth, confidences, lenient, notes))
    settle()
    return {key: result[key] for key in entries}


def _lines_one_by_one(
    sample: str,
    text: str,
    pattern: str,
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
        match = _compiled(pattern).fullmatch(line)
        if match is None and lenient:
            lenient_pattern = _LENIENT_GT_LINE if ground_truth else _LENIENT_DET_LINE
            match = _compiled(lenient_pattern).fullmatch(line)
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


def _member_reader(location: Path, archive: zipfile.ZipFile):
    """A reader of the archive's entries, faster than ``ZipFile.read`` for many small files.

    Stored and deflated entries are sliced out of the file read once and inflated with zlib
    (with the CRC check ``ZipFile.read`` makes); anything else goes through ``ZipFile.read``.
    """
    raw = location.read_bytes()

    def read(info: zipfile.ZipInfo) -> bytes:
        header = raw[info.header_offset : info.header_offset + 30]
        plain = info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
        if not plain or info.flag_bits & 0x1 or header[:4] != b"PK\x03\x04":
            return archive.read(info)
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_length + extra_length
        data = raw[start : start + info.compress_size]
        if info.compress_type == zipfile.ZIP_DEFLATED:
            data = zlib.decompress(data, -15)
        if zlib.crc32(data) != info.CRC:
            raise RrcRefusal(f"Bad CRC-32 for file {info.filename!r}")
        return data

    return read


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
        entries = [(info.filename, info) for info in archive.infolist()]
        read = _member_reader(location, archive)
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
