"""The record of an input line a reader skipped, shared by every reader of annotation or text files.

A malformed line never crashes a reader: it becomes a :class:`BadLine` (file, line number, reason)
so the caller can warn and count it, or, in strict mode, an :class:`AnnotationError`.
"""

from __future__ import annotations

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
