"""What every benchmark result holds besides its numbers: the command and the machine."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vramkit.core.io.checkpoint_io import atomic_write_bytes

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
TOY_ICDAR_DIR = REPO_ROOT / "tests" / "data" / "icdar2015_toy"


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the host's total)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpuinfo(field: str) -> str | None:
    """The first ``field`` line's value in Linux's /proc/cpuinfo; None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


SPEED_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
"""CPU instruction sets that change the numbers, recorded because a virtual machine's model name
is often just "AMD EPYC": oneDNN and onnxruntime pick their kernels by them (VNNI's int8 dot
products for quantised convolutions, AVX-512 for fp32)."""


def _cpu_features() -> list[str]:
    """Which of `SPEED_FEATURES` the CPU flags (Linux /proc/cpuinfo); [] where unknown."""
    flags = set((_cpuinfo("flags") or "").split())
    return [feature for feature in SPEED_FEATURES if feature in flags]


def _git_commit() -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the whole machine so far (Linux: /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    ticks = [int(value) for value in fields[1:9]]
    return (ticks[7], sum(ticks)) if len(ticks) == 8 else None


_TICKS_AT_START = _cpu_ticks()  # benchmarks import this module first thing


def cpu_steal_fraction() -> float | None:
    """Share of this machine's CPU time taken by the hypervisor for other guests since the
    benchmark started: above a few percent, a noisy neighbour is slowing every timing."""
    now = _cpu_ticks()
    if now is None or _TICKS_AT_START is None or now[1] <= _TICKS_AT_START[1]:
        return None
    return round((now[0] - _TICKS_AT_START[0]) / (now[1] - _TICKS_AT_START[1]), 4)


def machine_facts() -> dict[str, Any]:
    """Cores, CPU, GPU, library versions, the load average (1, 5, 15 min) right now and the
    CPU steal since the benchmark started."""
    import cv2

    facts: dict[str, Any] = {
        "usable_cores": usable_cores(),
        "host_cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "cpu_features": _cpu_features(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "opencv": cv2.__version__,
        "platform": platform.platform(),
        "git_commit": _git_commit(),
    }
    if hasattr(os, "getloadavg"):
        facts["load_average"] = [round(value, 2) for value in os.getloadavg()]
    facts["cpu_steal_fraction"] = cpu_steal_fraction()
    return facts


def command_line() -> str:
    """How this benchmark was started, as a shell command run from the repository root."""
    module = sys.modules["__main__"].__spec__
    if module is not None:
        return shlex.join(["python", "-m", module.name, *sys.argv[1:]])
    return shlex.join(["python", *sys.argv])


def write_result(
    name: str, numbers: dict[str, Any], *, started: float, directory: Path = RESULTS_DIR
) -> Path:
    """Write ``<directory>/<name>.json``: the command, the machine, ``numbers``, the run time.

    ``started`` is the benchmark's ``time.perf_counter()`` at its start.
    """
    result = {
        "benchmark": name,
        "command": command_line(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_facts(),
        "results": numbers,
        "benchmark_seconds": round(time.perf_counter() - started, 2),
    }
    path = Path(directory) / f"{name}.json"
    atomic_write_bytes(path, (json.dumps(result, indent=2) + "\n").encode("utf-8"))
    return path
