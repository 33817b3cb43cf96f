"""Read labelled texts from JSON Lines: one ``{"text": str, "label": int | str}`` per line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vramkit.core.data.bad_lines import AnnotationError, BadLine


@dataclass(frozen=True)
class LabelledText:
    """One example: the text and its class index."""

    text: str
    label: int


def read_labelled_texts(
    path: Path,
    *,
    num_labels: int,
    label_names: Sequence[str] | None = None,
    strict: bool = True,
) -> tuple[list[LabelledText], list[BadLine]]:
    """The examples of a JSONL file, and the lines that are not examples.

    A label is a class index in ``[0, num_labels)`` or, when ``label_names`` is given, one of
    those names. Blank lines are ignored. A bad line (not JSON, not an object, a missing or
    wrong ``text``/``label``) raises :class:`AnnotationError` naming the file and line when
    ``strict``; otherwise it is returned in the second list and the rest is read.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise FileNotFoundError(f"cannot read the JSONL file {path}: {error}") from None
    except UnicodeDecodeError as error:
        raise AnnotationError(f"{path}: not UTF-8 text ({error})") from None
    names = {name: index for index, name in enumerate(label_names or ())}
    examples: list[LabelledText] = []
    bad: list[BadLine] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        example, reason = _parse(line, num_labels, names)
        if reason is None:
            examples.append(example)
            continue
        problem = BadLine(path, number, reason)
        if strict:
            raise AnnotationError(str(problem))
        bad.append(problem)
    return examples, bad


def _parse(
    line: str, num_labels: int, names: dict[str, int]
) -> tuple[LabelledText | None, str | None]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return None, f"not JSON ({error.msg} at column {error.colno})"
    if not isinstance(record, dict):
        return None, f"expected an object with 'text' and 'label', got {type(record).__name__}"
    text = record.get("text")
    if not isinstance(text, str):
        return None, f"'text' must be a string, got {text!r}"
    if "label" not in record:
        return None, "no 'label' key"
    label = record["label"]
    if isinstance(label, str) and names:
        if label not in names:
            return None, f"label {label!r} is not one of data.label_names {sorted(names)}"
        return LabelledText(text, names[label]), None
    if isinstance(label, bool) or not isinstance(label, int):
        expected = "a class index or a name from data.label_names" if names else "a class index"
        return None, f"'label' must be {expected}, got {label!r}"
    if not 0 <= label < num_labels:
        return None, f"label {label} is outside [0, {num_labels}) (data.num_labels={num_labels})"
    return LabelledText(text, label), None
