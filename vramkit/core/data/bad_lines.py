"""The record of an input line a reader skipped, shared by every reader of annotation or text files.

A malformed line never crashes a reader: it becomes a :class:`BadLine` (file, line number, reason)
so the caller can warn and count it, or, in strict mode, an :class:`AnnotationError`.
`warn_file_problems` warns about one file's problems: a few lines, then a count.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class AnnotationError(ValueError):
    """A malformed annotation in strict mode; the message names the file and line."""


@dataclass(frozen=True)
class BadLine:
    """One line that could not be parsed."""

    path: Path
    line_number: int  # 1-based, as an editor shows it
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line_number}: {self.reason}"


DETAILED_LINES_PER_FILE = 5
"""Problems of one file warned about line by line; the rest of that file's are one summary line.

One image with 10,000 boxes gave 1,162 warning lines: the first few say what is wrong, the count
says how much. The bad-input record (the readers' counters) still counts every problem."""

_reported: set[tuple[str, int]] = set()


def warn_file_problems(
    path: Path, problems: Sequence[tuple[str, str]], category: type[Warning]
) -> None:
    """Warn once per process about the ``(kind, message)`` problems found in file ``path``.

    The first `DETAILED_LINES_PER_FILE` messages are warned as they are, then one line counts the
    rest by kind. A file read again unchanged (the plan's read and the run's, or the training and
    validation sets of one folder) is not reported again: Python's once-per-location filter
    forgets what it showed whenever a library enters ``warnings.catch_warnings``.
    """
    if not problems:
        return
    try:
        key = (str(path), path.stat().st_mtime_ns)
    except OSError:
        key = (str(path), 0)
    if key in _reported:
        return
    _reported.add(key)
    for _, message in problems[:DETAILED_LINES_PER_FILE]:
        warnings.warn(message, category, stacklevel=3)
    rest = Counter(kind for kind, _ in problems[DETAILED_LINES_PER_FILE:])
    if rest:
        kinds = ", ".join(f"{count} {kind}" for kind, count in rest.most_common())
        warnings.warn(
            f"{path}: {sum(rest.values())} more problems in this file not shown ({kinds}); "
            f"{len(problems)} in all, each counted in the bad-input record",
            category,
            stacklevel=3,
        )
