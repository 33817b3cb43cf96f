"""Training data throughput per loader core at 640×640: decode, augmentation, DBNet targets.

For the synthetic data (rendered once at 640 px into ``data/``) and the 7 real ICDAR 2015 toy
images (1280×720), the training dataset is built by the project's own data config, exactly as
``train.py`` builds it, and measured two ways:

- ``in_process`` (the headline ``samples_per_core_s``): ``dataset[i]`` in this process on one
  thread: decode, augmentation, target maps, tensors: the work of a worker core. Samples leave
  the worker compact (uint8 image and binary maps, 4.1 MB at 640 px); the float conversion and
  normalisation happen on the device (``vramkit.tasks.text_detection.data.device_inputs``), not
  here.
- ``loader``: the real ``DataLoader`` with one persistent worker process, batching and the
  transfer of each batch to the main process through shared memory included; samples per
  CPU-second of that worker, read from ``/proc`` (Linux), its start-up and first batch left
  out.

Samples per CPU-second is samples per second per fully used core, and stays meaningful on a
machine shared with other work, where wall-clock rates depend on the load; those are recorded
too. The target is at least 40 samples per second per core.

``python -m benchmarks.data_pipeline [--samples N]`` writes ``results/data_pipeline.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from omegaconf import OmegaConf

from benchmarks.configs import compose_run_config, quiet_libraries
from benchmarks.record import RESULTS_DIR, TOY_ICDAR_DIR, write_result
from vramkit.core.config.instantiate import instantiate
from vramkit.tasks.text_detection.data.icdar_folder import DataWarning

CROP_SIDE = 640  # px
TARGET_PER_CORE = 40.0  # samples/s
BATCH_SIZE = 8

DATASETS = {
    "synthetic": (
        "data.synthetic.num_train=48",
        "data.synthetic.num_val=1",
        f"data.synthetic.image_size={CROP_SIDE}",
    ),
    "icdar2015_toy": (
        "data=icdar2015",
        f"data.train_dir={TOY_ICDAR_DIR}",
        f"data.val_dir={TOY_ICDAR_DIR}",
    ),
}


def _worker_pids() -> list[int]:
    """Processes whose parent is this one (Linux: read from /proc)."""
    own = str(os.getpid())
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if fields[1] == own:
            pids.append(int(stat.parent.name))
    return pids


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux: /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_in_process(dataset: Any, samples: int, seed: int = 0) -> dict[str, float]:
    """``dataset[i]`` for ``samples`` random indices in this process, one thread."""
    rng = np.random.default_rng(seed)
    for index in range(min(3, len(dataset))):
        dataset[index]  # warm-up: first calls build lazily-made state
    order = rng.integers(0, len(dataset), samples)
    cpu, wall = time.process_time(), time.perf_counter()
    for index in order:
        dataset[int(index)]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "samples": samples,
        "cpu_seconds": round(cpu, 3),
        "samples_per_core_s": round(samples / cpu, 1),
        "wall_samples_per_s": round(samples / wall, 1),
    }


def measure_loader(datamodule: Any, samples: int) -> dict[str, float]:
    """The training DataLoader with one persistent worker: samples per CPU-second of the worker.

    The worker's start and first batch are left out; then ``samples`` samples are drawn, over
    as many epochs as that takes (the same worker serves them all).
    """
    datamodule.settings = datamodule.settings.model_copy(
        update={"num_workers": 1, "persistent_workers": True, "batch_size": BATCH_SIZE}
    )
    loader = datamodule.train_dataloader()
    iterator = iter(loader)
    next(iterator)
    (worker,) = _worker_pids()
    cpu, wall = _cpu_seconds(worker), time.perf_counter()
    seen = 0
    while seen < samples:
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            continue
        seen += int(batch["image"].shape[0]) if "image" in batch else 0
    cpu, wall = _cpu_seconds(worker) - cpu, time.perf_counter() - wall
    del iterator, loader  # stops the worker
    return {
        "samples": seen,
        "worker_cpu_seconds": round(cpu, 3),
        "samples_per_core_s": round(seen / cpu, 1),
        "wall_samples_per_s": round(seen / wall, 1),
    }


def measure(name: str, samples: int, work_dir: Path) -> dict[str, Any]:
    """Both measurements for one of :data:`DATASETS`."""
    cfg = compose_run_config(
        "+hw=cpu",
        *DATASETS[name],
        f"data.image_size={CROP_SIDE}",
        f"data.val_image_size={CROP_SIDE}",
        output_dir=work_dir / name,
    )
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    dataset = datamodule.train_dataset
    sample = dataset[0]
    result: dict[str, Any] = {
        "images": len(dataset),
        "sample_shape": list(sample["image"].shape),
        "augment": OmegaConf.to_container(cfg.data.augment),
        "in_process": measure_in_process(dataset, samples),
        "loader": measure_loader(datamodule, samples),
    }
    result["samples_per_core_s"] = result["in_process"]["samples_per_core_s"]
    result["loader_samples_per_core_s"] = result["loader"]["samples_per_core_s"]
    result["meets_target"] = result["samples_per_core_s"] >= TARGET_PER_CORE
    return result


def run(samples: int = 160) -> dict[str, Any]:
    """Measure every dataset of :data:`DATASETS` over ``samples`` training samples each."""
    quiet_libraries()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    numbers: dict[str, Any] = {
        "crop_side_px": CROP_SIDE,
        "target_samples_per_core_s": TARGET_PER_CORE,
        "loader_batch_size": BATCH_SIZE,
    }
    with tempfile.TemporaryDirectory() as work, warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # the toy set's odd lines are known
        for name in DATASETS:
            numbers[name] = measure(name, samples, Path(work))
    return numbers


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line; returns the numbers written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_pipeline", description=__doc__)
    parser.add_argument("--samples", type=int, default=160, help="samples per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder of the JSON file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    numbers = run(samples=args.samples)
    path = write_result("data_pipeline", numbers, started=started, directory=args.out)
    for name in DATASETS:
        print(
            f"data pipeline, {name}: {numbers[name]['samples_per_core_s']} samples/s per core, "
            f"{numbers[name]['loader_samples_per_core_s']} through the loader "
            f"(target {TARGET_PER_CORE:.0f}) -> {path}"
        )
    return numbers


if __name__ == "__main__":
    main()
