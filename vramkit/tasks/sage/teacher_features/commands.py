"""The command lines that make a missing teacher or feature cache, for error messages."""

from __future__ import annotations

import shlex

from vramkit.core.config.source import command_line_overrides

TEACHER_ENTRY = "train.py"
FEATURES_ENTRY = "scripts/extract_teacher_features.py"


def suggest_command(entry: str, *, task: str) -> str:
    """``python <entry> task=<task> <this run's other overrides>``.

    The overrides of the running command (``experiment=sage_small``, ``paths.…``) are repeated,
    so the suggested command makes the teacher or cache this run is looking for.
    """
    overrides = [
        override
        for override in command_line_overrides()
        if not override.lstrip("+~").startswith("task=")
    ]
    return shlex.join(["python", entry, f"task={task}", *overrides])
