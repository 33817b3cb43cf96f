"""The transformers release a field case was measured with, installed beside the project's own.

A model's memory is a property of its code as much as of its shapes: OPT's eager attention in
transformers 4.46 clamps the masked scores with ``torch.max(scores, finfo.min)``, whose backward
keeps one more ``[B, H, T, T]`` block per layer than the same model in transformers 5 (24 x 128 MiB
at batch 1 x 2048 tokens). Replaying such a measurement with today's code measures library drift,
not the planner. A case names the release it replays with (``frameworks.replay_transformers``);
this module installs that release once, with the ``tokenizers`` and ``huggingface_hub`` pins of its
own dependency table, into ``benchmarks/.model_code/transformers-<version>/`` (``pip --target``,
no dependencies, the project's torch), so that a subprocess can put it first on ``sys.path``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.record import REPO_ROOT

CACHE_DIR = REPO_ROOT / "benchmarks" / ".model_code"
# The packages transformers imports at start-up whose versions it checks against its own table.
_PINNED_DEPENDENCIES = ("tokenizers", "huggingface-hub")


def release_dir(version: str) -> Path:
    """Where transformers `version` lives once installed (it may not be yet)."""
    return CACHE_DIR / f"transformers-{version}"


def ensure_release(version: str) -> Path | None:
    """Install transformers `version` and its pinned dependencies once; its folder, or None.

    None when pip cannot install it (no registry access): the caller replays with the installed
    release and says so.
    """
    target = release_dir(version)
    marker = target / ".complete"
    if marker.is_file():
        return target
    if not _pip_install(target, [f"transformers=={version}"]):
        return None
    table = target / "transformers" / "dependency_versions_table.py"
    pins = _dependency_pins(table.read_text()) if table.is_file() else {}
    specs = [pins[name] for name in _PINNED_DEPENDENCIES if name in pins]
    if specs and not _pip_install(target, specs):
        return None
    marker.write_text(version + "\n")
    return target


def _dependency_pins(table_source: str) -> dict[str, str]:
    """`{package: requirement}` from transformers' `dependency_versions_table.py` text."""
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)":\s*"([^"]+)"', table_source))


def _pip_install(target: Path, specs: list[str]) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade"]
    command += ["--target", str(target), *specs]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        print(f"model_code: pip could not install {specs}: {completed.stderr.strip()[-300:]}")
    return completed.returncode == 0
