"""ICDAR 2015 evaluation speed: vramkit's official protocol against a replay of the official script.

Both evaluate the same generated ground-truth and submission zip files (500 images x 100
ground-truth quads x 100 detections by default, integer clockwise quads as the RRC site takes
them; a tenth of the ground truth is ``###`` in the script's spellings, a few quads per image are
self-intersecting, zero-area or repeated-point; most detections are jittered copies of ground
truth, so IoUs spread around 0.5). Each side runs as its own process from the command line, so
interpreter start-up, imports and zip reading are included:

- vramkit: ``python -m vramkit.tasks.text_detection.evaluation.evaluate gt.zip submit.zip``;
- reference: ``tests/tasks/text_detection/rrc_reference.py -g=gt.zip -s=submit.zip``, a literal
  replay of the script's algorithm with the Polygon library (``pip install Polygon3``), every
  gt x detection pair through ``Polygon & Polygon`` as the script does.

The precision, recall and hmean of the two must be identical; the benchmark stops otherwise.

``python -m benchmarks.evaluation [--images N]`` writes ``results/evaluation.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.record import REPO_ROOT, RESULTS_DIR, write_result

IMAGE_WIDTH, IMAGE_HEIGHT = 1280, 720  # px, the ICDAR 2015 image size
REFERENCE = REPO_ROOT / "tests" / "tasks" / "text_detection" / "rrc_reference.py"
DONT_CARE_SPELLINGS = ("###", '"###"')
TEXTS = ("word", '"a,b"', " ###", "### ")  # the last two are care regions for the script


def _clockwise(quad: np.ndarray) -> np.ndarray:
    """The quad in the script's clockwise order (sum of (x2 - x1)(y2 + y1) not positive)."""
    x, y = quad[:, 0], quad[:, 1]
    total = ((np.roll(x, -1) - x) * (np.roll(y, -1) + y)).sum()
    return quad[::-1] if total > 0 else quad


def _rotated_box(rng: np.random.Generator, centre: np.ndarray, width: float, height: float):
    angle = np.deg2rad(rng.uniform(-20, 20))
    axes = np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
    corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [width / 2, height / 2]
    return centre + corners @ axes


def make_scene(
    rng: np.random.Generator, gt_count: int = 100, det_count: int = 100
) -> tuple[list[np.ndarray], list[str], list[np.ndarray]]:
    """One image's ground-truth quads and transcriptions, and its detections (integer px)."""
    gt = []
    for _ in range(gt_count):
        centre = rng.uniform([0, 0], [IMAGE_WIDTH, IMAGE_HEIGHT])
        gt.append(_rotated_box(rng, centre, rng.uniform(20, 160), rng.uniform(10, 50)))
    texts = [
        DONT_CARE_SPELLINGS[rng.integers(2)] if rng.random() < 0.1 else TEXTS[rng.integers(4)]
        for _ in range(gt_count)
    ]
    detections = []
    copies = int(det_count * 0.8)
    for source in rng.choice(gt_count, copies):
        quad = gt[source]
        centre = quad.mean(axis=0)
        scale = rng.uniform(0.75, 1.25, 2)
        shift = rng.normal(0.0, 0.15, 2) * np.ptp(quad, axis=0)
        detections.append((quad - centre) * scale + centre + shift)
    for _ in range(det_count - copies):
        centre = rng.uniform([0, 0], [IMAGE_WIDTH, IMAGE_HEIGHT])
        detections.append(_rotated_box(rng, centre, rng.uniform(20, 160), rng.uniform(10, 50)))
    # Degenerate quads the script counts: a bow-tie, a zero-area line, a repeated point.
    for quads in (gt, detections):
        if len(quads) >= 3:
            quads[0] = quads[0][[0, 2, 1, 3]]
            quads[1] = np.array([quads[1][0], quads[1][1], quads[1][1], quads[1][0]])
            quads[2] = np.array([*quads[2][:3], quads[2][2]])
    gt = [_clockwise(np.round(quad).astype(np.int64)) for quad in gt]
    detections = [_clockwise(np.round(quad).astype(np.int64)) for quad in detections]
    return gt, texts, detections


def write_zips(folder: Path, images: int, gt_count: int, det_count: int, seed: int) -> tuple:
    """Write ``gt.zip`` and ``submit.zip`` for ``images`` generated images; return their paths."""
    rng = np.random.default_rng(seed)
    gt_zip, submit_zip = folder / "gt.zip", folder / "submit.zip"
    with (
        zipfile.ZipFile(gt_zip, "w", zipfile.ZIP_DEFLATED) as gt_file,
        zipfile.ZipFile(submit_zip, "w", zipfile.ZIP_DEFLATED) as submit_file,
    ):
        for image in range(1, images + 1):
            gt, texts, detections = make_scene(rng, gt_count, det_count)
            gt_lines = [
                ",".join(map(str, q.reshape(-1).tolist())) + "," + t
                for q, t in zip(gt, texts, strict=True)
            ]
            det_lines = [",".join(map(str, q.reshape(-1).tolist())) for q in detections]
            gt_file.writestr(f"gt_img_{image}.txt", "\ufeff" + "\r\n".join(gt_lines))
            submit_file.writestr(f"res_img_{image}.txt", "\n".join(det_lines))
    return gt_zip, submit_zip


def _timed_process(command: list[str]) -> tuple[str, float, float]:
    """stdout, wall seconds and CPU seconds (user + system) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout, wall, cpu


def _metrics(stdout: str) -> dict:
    line = stdout.strip().splitlines()[-1]
    return json.loads(line.removeprefix("Calculated!"))


def run(
    images: int = 500, gt_count: int = 100, det_count: int = 100, seed: int = 0, repeats: int = 5
) -> dict:
    """Time both command lines on generated zips; raise if their metrics differ."""
    with tempfile.TemporaryDirectory() as scratch:
        gt_zip, submit_zip = write_zips(Path(scratch), images, gt_count, det_count, seed)
        fast_command = [
            sys.executable,
            "-m",
            "vramkit.tasks.text_detection.evaluation.evaluate",
            str(gt_zip),
            str(submit_zip),
        ]
        fast_runs = [_timed_process(fast_command) for _ in range(repeats)]
        reference_command = [sys.executable, str(REFERENCE), f"-g={gt_zip}", f"-s={submit_zip}"]
        reference_out, reference_wall, reference_cpu = _timed_process(reference_command)
    fast = _metrics(fast_runs[0][0])
    reference = _metrics(reference_out)
    keys = ("precision", "recall", "hmean", "matched", "gt_care", "det_care")
    if any(fast[key] != reference[key] for key in keys):
        raise AssertionError(f"metrics differ from the script replay:\n{fast}\n{reference}")
    fast_wall = min(run[1] for run in fast_runs)
    fast_cpu = min(run[2] for run in fast_runs)
    return {
        "images": images,
        "gt_per_image": gt_count,
        "detections_per_image": det_count,
        "identical_results": True,
        "metrics": {key: fast[key] for key in keys},
        "threshold_ties": fast["threshold_ties"],
        "tie_breaker": fast["tie_breaker"],
        "vramkit_seconds": round(fast_cpu, 3),
        "reference_seconds": round(reference_cpu, 3),
        "speedup": round(reference_cpu / fast_cpu, 1),
        "vramkit_wall_seconds": round(fast_wall, 3),
        "reference_wall_seconds": round(reference_wall, 3),
        "speedup_wall": round(reference_wall / fast_wall, 1),
        "target_speedup": 20,
        "timing": "whole command lines as child processes (start-up, imports, zip reading "
        f"included); CPU seconds (user + system) best of {repeats} for vramkit, 1 for the "
        "reference; *_wall_* are wall-clock on a shared machine",
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line; returns the numbers written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.evaluation", description=__doc__)
    parser.add_argument("--images", type=int, default=500, help="generated images")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder of the JSON file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    numbers = run(images=args.images)
    path = write_result("evaluation", numbers, started=started, directory=args.out)
    print(
        f"evaluation: vramkit {numbers['vramkit_seconds']:.2f} s, script replay "
        f"{numbers['reference_seconds']:.1f} s, speedup {numbers['speedup']}x -> {path}"
    )
    return numbers


if __name__ == "__main__":
    main()
