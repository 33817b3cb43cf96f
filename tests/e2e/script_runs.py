"""Run an entry point (``python train.py …``, ``eval.py``, an export) as its own process.

Every such run gets the same environment: ``PROJECT_ROOT`` is the repository (the run may work in
a temporary folder), and ``tests/e2e`` is importable before the repository, so a config can name a
drill (``+callbacks.drill._target_=drill_callbacks.SignalSelf``). Beside it,
:mod:`tests.e2e.entry_points` runs a script in this process, for refusals.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.entry_points import REPO

E2E = Path(__file__).resolve().parent


def script_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``PROJECT_ROOT`` and ``PYTHONPATH`` set for a script run;
    ``extra`` adds or replaces variables (``OMP_NUM_THREADS="1"``)."""
    return {
        **os.environ,
        "PROJECT_ROOT": str(REPO),
        "PYTHONPATH": os.pathsep.join([str(E2E), str(REPO)]),
        **extra,
    }


def script_command(script: str, *args: str) -> list[str]:
    """``python <script> <args>`` with this interpreter; ``script`` relative to the repository."""
    return [sys.executable, str(REPO / script), *args]


def run_script(
    script: str, *args: str, cwd: Path, timeout_s: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``python <script> <args>`` in ``cwd`` until it exits (at most ``timeout_s`` s); its
    exit status and its stdout and stderr as text. ``env``: default :func:`script_env`."""
    return subprocess.run(
        script_command(script, *args),
        cwd=cwd,
        env=script_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
