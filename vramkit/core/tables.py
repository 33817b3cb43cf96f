"""The one way vramkit renders a table for the console and for report files: plain text.

Every summary (memory per phase, throughput, checkpoint storage, the memory plan, the SAGE
compression report) goes through `render_table`, so they share one look: a title line, a
boxed table whose first column and any column named in ``left`` are left-aligned and all others
right-aligned (numbers), and an optional caption, with no colour codes, so that the same text
reads well in a terminal, a log file and a CI log.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table


def render_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    title: str | None = None,
    caption: str | None = None,
    left: Sequence[str] = (),
    width: int = 110,
) -> str:
    """``rows`` (cells already formatted as text) under ``columns``, as plain text.

    ``width`` is the most characters a line may take; cells wrap beyond it. Text in square
    brackets is shown as it is (no rich markup).
    """
    table = Table(title=title, caption=caption)
    for index, name in enumerate(columns):
        justify = "left" if index == 0 or name in left else "right"
        table.add_column(name, justify=justify)
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} cells for {len(columns)} columns: {row!r}")
        table.add_row(*(_plain(cell) for cell in row))
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, highlight=False).print(table)
    return buffer.getvalue().rstrip("\n")


def _plain(cell: str) -> str:
    # rich reads "[x]" as markup; a file name or a metric may contain brackets.
    return cell.replace("[", r"\[")
