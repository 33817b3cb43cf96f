"""The shapes of the lines a default vramkit run prints, for tests that refuse any other line.

A default run prints vramkit's log records (Hydra's format, a ``vramkit.`` logger), the
continuation lines of its multi-line records (the hardware profile), its tables (boxed, with
centred titles and captions) and the model summary's totals. Anything else, a library's chatter
(``Seed set to 42``, ``wandb: ...``, a ``FutureWarning``) or a traceback, is not one of them.
"""

from __future__ import annotations

import re

VRAMKIT_LINE_SHAPES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern)
    for pattern in (
        # a log record of vramkit's own loggers, as Hydra's job logging formats it
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]\[vramkit\.[\w.]+\]\[(INFO|WARNING)\] - \S",
        # the hardware profile block (vramkit/core/run/settling/settle.py, Settlement.__str__)
        r"^hardware profile \S+ on \S",
        r"^  (precision|batch size|loader|memory|remedy|compile) ",
        r"^settled for \S",
        r"^settlement overrides: ",
        r"^remedy: ",
        # a table of vramkit/core/tables.py or the model summary: box lines
        r"^[┏┃┡│└].*[┓┃┩│┘]\s*$",
        # a table's centred title or caption: padded on both sides
        r"^ {2,}\S.*\S {1,}$",
        # the model summary's totals (vramkit/core/callbacks/model_summary.py)
        r"^(Trainable params|Non-trainable params|Total params|Modules in (train|eval) mode|"
        r"Total FLOPs): \S",
        r"^Total estimated model params size \(MB\): \S",
    )
)


def foreign_lines(output: str) -> list[str]:
    """The non-empty lines of `output` that have none of vramkit's shapes."""
    return [
        line
        for line in output.splitlines()
        if line.strip() and not any(shape.search(line) for shape in VRAMKIT_LINE_SHAPES)
    ]


def empty_folders(root) -> list[str]:
    """The empty folders below `root`, relative to it."""
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_dir() and not any(path.iterdir())
    )
