"""Validation cost per sample against training, for the default task, validation cache warm.

The default task (``python train.py``: DBNet on the synthetic text set, the profile detected
from the machine) runs shortened epochs, ``limit_train_batches`` training batches then the
whole validation set each, through ``train()`` with every default callback and logger. The
number is the throughput callback's ``perf/val_train_time_ratio`` (time per validation sample ÷
time per training sample, data waits included) of the last validation, read back from the run's
CSV log; the target is at most 0.6 (issue #36).

Two epochs, because the training side is measured warm (the callback leaves its first
``warmup_steps`` steps out) and the first validation is not: its first batches at the new
320 px shapes touch fresh memory (60-65 thousand minor page faults and 0.6-0.8 s of system
time in its first forward on a 2-core VM, none from the fourth batch on), a cost paid once per
run. The first validation's ratio is recorded beside the last (``first_validation_ratio``).

Before the run the validation set is read once so the cache holds every entry ("warm"), and
that read is timed against one with the cache switched off: the per-sample cost of validation
data with and without the cache.

``python -m benchmarks.validation_ratio [--train-batches N]`` writes
``results/validation_ratio.json``.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from benchmarks.configs import compose_run_config, quiet_libraries
from benchmarks.record import RESULTS_DIR, write_result
from vramkit.core.config.instantiate import instantiate
from vramkit.core.run.train import train
from vramkit.tasks.text_detection.data.icdar_folder import DataWarning

TARGET_RATIO = 0.6  # issue #36: validation against training ≤ 0.6
RATIO_METRIC = "perf/val_train_time_ratio"
REPORTED_METRICS = (
    RATIO_METRIC,
    "perf/train_samples_per_s",
    "perf/val_samples_per_s",
    "perf/data_wait_fraction",
    "perf/train_step_ms_median",
    "val/hmean",
)


def last_logged(metrics_csv: Path, names: Sequence[str]) -> dict[str, float]:
    """The last value of each of ``names`` in a Lightning ``metrics.csv`` (absent: left out)."""
    values: dict[str, float] = {}
    with metrics_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            for name in names:
                if row.get(name):
                    values[name] = float(row[name])
    return values


def logged_series(metrics_csv: Path, name: str) -> list[float]:
    """Every value of ``name`` in a Lightning ``metrics.csv``, in the order logged."""
    with metrics_csv.open(newline="") as handle:
        return [float(row[name]) for row in csv.DictReader(handle) if row.get(name)]


def _seconds_per_sample(dataset: Any) -> float:
    started = time.process_time()
    for index in range(len(dataset)):
        dataset[index]
    return (time.process_time() - started) / len(dataset)


def validation_data_cost(cfg: Any) -> dict[str, Any]:
    """CPU ms per validation sample without and with the (warmed) cache, and the cache's state."""
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("validate")
    dataset = datamodule.val_dataset
    cache = dataset.cache
    if cache is None:
        raise RuntimeError("the default task's validation cache is off (data.val_cache.enabled)")
    before = cache.report()
    dataset.cache = None
    uncached = _seconds_per_sample(dataset)
    dataset.cache = cache
    _seconds_per_sample(dataset)  # fills whatever the cache lacks
    warm = _seconds_per_sample(dataset)
    after = cache.report()
    return {
        "samples": len(dataset),
        "entries_before": before.entries,
        "uncached_ms_per_sample": round(uncached * 1000, 2),
        "cached_ms_per_sample": round(warm * 1000, 2),
        "cache": after.as_dict(),
    }


def run(train_batches: int = 20, epochs: int = 2) -> dict[str, Any]:
    """Warm the cache, run the shortened default task, read the logged ratios."""
    quiet_libraries()
    overrides = (
        f"trainer.max_epochs={epochs}",
        f"+trainer.limit_train_batches={train_batches}",
        "logger=csv",
    )
    with tempfile.TemporaryDirectory() as work, warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        output_dir = Path(work) / "run"
        probe = compose_run_config(*overrides, output_dir=output_dir)
        data_cost = validation_data_cost(probe)
        cfg = compose_run_config(*overrides, output_dir=output_dir, resolve=False)
        started = time.perf_counter()
        train(cfg)
        run_seconds = time.perf_counter() - started
        (metrics_csv,) = output_dir.glob("csv/version_*/metrics.csv")
        logged = last_logged(metrics_csv, REPORTED_METRICS)
        ratios = logged_series(metrics_csv, RATIO_METRIC)
    if not ratios:
        raise RuntimeError(f"{RATIO_METRIC} was not logged; found {sorted(logged)}")
    return {
        "val_train_time_ratio": round(ratios[-1], 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratios[-1] <= TARGET_RATIO,
        "first_validation_ratio": round(ratios[0], 3),
        "ratio_by_validation": [round(ratio, 3) for ratio in ratios],
        "logged": {name: round(value, 4) for name, value in logged.items()},
        "profile": probe.hw.name,
        "model_net": OmegaConf.to_container(probe.model.net),
        "batch_size": probe.hw.batch_size,
        "val_batch_size": probe.hw.val_batch_size,
        "train_batches": train_batches,
        "epochs": epochs,
        "validation_data": data_cost,
        "run_seconds": round(run_seconds, 1),
        "overrides": list(overrides),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line; returns the numbers written."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.validation_ratio", description=__doc__
    )
    parser.add_argument(
        "--train-batches", type=int, default=20, help="training batches before validation"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=2,
        help="epochs, each ending in a validation; the last one counts",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder of the JSON file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    numbers = run(train_batches=args.train_batches, epochs=args.epochs)
    path = write_result("validation_ratio", numbers, started=started, directory=args.out)
    print(
        f"validation/training time per sample: {numbers['val_train_time_ratio']} "
        f"(target {TARGET_RATIO}; first validation {numbers['first_validation_ratio']}) -> {path}"
    )
    return numbers


if __name__ == "__main__":
    main()
