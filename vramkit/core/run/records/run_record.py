"""What ran, beside the resolved config: the code version and the environment of a run.

`train()` writes `run_environment.json` into every run folder, so that two runs can be compared
later (`python -m vramkit.compare_runs`) on more than their configs: the commit and a hash of any
uncommitted change, and the libraries and device that executed them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from vramkit.core.io.checkpoint_io import atomic_write_bytes

RECORD_NAME = "run_environment.json"
_LIBRARIES = ("torch", "lightning", "hydra-core", "transformers", "numpy")


def code_version(repo: Path) -> dict[str, Any]:
    """`{"commit", "dirty", "diff_sha256"}` of the git checkout at `repo` (nulls outside git)."""
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        diff = _git(repo, "diff", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None, "diff_sha256": None}
    return {
        "commit": commit,
        "dirty": bool(diff),
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None,
    }


def environment() -> dict[str, Any]:
    """Library versions, Python, CUDA and the GPU this process runs with."""
    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "python": platform.python_version(),
        "libraries": versions,
        "cuda": torch.version.cuda,
        "gpu": gpu,
    }


def write_run_record(output_dir: Path, repo: Path, name: str = RECORD_NAME) -> Path:
    """Write `name` (`run_environment.json`: code version and environment) into `output_dir`."""
    record = {"code": code_version(repo), "environment": environment()}
    path = Path(output_dir) / name
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())
    return path


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=10
    ).stdout
