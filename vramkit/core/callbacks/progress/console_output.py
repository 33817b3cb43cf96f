"""Whether the run's output is a live console (a terminal or a notebook) or a log file."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def console_is_live(console_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether a progress bar drawn on ``rich.console.Console(**console_kwargs)`` is seen as it
    moves: a terminal that is not dumb (``TERM=dumb``) or a Jupyter notebook. False where the
    output goes to a file or a pipe (a CI log, a SLURM log, ``| tee``): Rich draws nothing there
    until the bar stops, then its last frame (rich/live.py, ``Live.refresh``: only a terminal
    that is not dumb, or Jupyter, redraws).
    """
    console = Console(**(console_kwargs or {}))
    return (console.is_terminal and not console.is_dumb_terminal) or console.is_jupyter
