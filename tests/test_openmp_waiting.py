"""Importing vramkit makes OpenMP threads wait passively unless the user chose otherwise."""

import os
import subprocess
import sys

SCRIPT = "import os, vramkit, torch; print(os.environ['OMP_WAIT_POLICY'])"


def _policy(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_passive_by_default_and_the_users_choice_kept():
    assert _policy() == "PASSIVE"
    assert _policy(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
