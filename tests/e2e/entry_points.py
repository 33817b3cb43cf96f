"""Run an entry point (``python train.py …``, ``python scripts/export.py …``) in this process.

``sys.argv`` is set as Hydra reads it, so a refusal costs a composition, not an interpreter start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parents[2]


def run_entry_point(monkeypatch, capsys, script: str, *args: str) -> tuple[int, str]:
    """Run ``python <script> <args>`` (a path from the repository root) here; its exit status
    and stderr. The script must end by exiting (a refusal does)."""
    spec = importlib.util.spec_from_file_location("entry_point", REPO / script)
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    if not hasattr(entry.main, "__wrapped__"):  # a script over a `vramkit` command: main(argv)
        try:
            code = entry.main(list(args))
        finally:
            GlobalHydra.instance().clear()
        return code, capsys.readouterr().err
    # Hydra finds conf/ beside the file of a task function defined in __main__, as when run
    entry.main.__wrapped__.__module__ = "__main__"
    typos = getattr(entry, "did_you_mean_on_refusal", None)
    around = typos(Path(script).stem) if typos else contextlib.nullcontext()
    try:
        with pytest.raises(SystemExit) as stop, around:
            entry.main()
    finally:
        GlobalHydra.instance().clear()
    return stop.value.code, capsys.readouterr().err
