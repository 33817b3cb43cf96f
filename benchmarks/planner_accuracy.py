"""How close the memory planner's predictions are to a real GPU run (target: within ±10%).

For the text detection task at three batch sizes, the planner predicts what
`torch.cuda.max_memory_allocated()` will read after the training phase (two optimizer steps)
and after validation (one batch, with the training state resident); then a real Lightning
`Trainer.fit` runs exactly that on this machine's GPU and the two are compared. The profile is
the one this GPU is detected as (or `+hw=<name>` when given), with `compile` off, since the
planner traces eager code. The synthetic dataset is kept small (it is rendered first).

    python -m benchmarks.planner_accuracy [--batch-sizes 8 16 32] [Hydra overrides…]

writes `benchmarks/results/planner_accuracy.json`. Without a CUDA GPU it exits with status 2
and says so: there is nothing to compare with.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import time
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf, open_dict

from benchmarks.record import REPO_ROOT, write_result
from vramkit.core.config.instantiate import instantiate
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner import plan_task
from vramkit.core.run.settling.compose import CONF_DIR, compose_config
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.core.run.settling.resolve_hardware import requested_profile
from vramkit.core.units import GIB

NAME = "planner_accuracy"
TARGET_ERROR_PCT = 10.0
DEFAULT_BATCH_SIZES = (8, 16, 32)
# Enough images for two training batches of the largest size, rendered once.
SMALL_DATA = ("data.synthetic.num_train=96", "data.synthetic.num_val=48")


class PhasePeaks(L.Callback):
    """`torch.cuda.max_memory_allocated()` over the training steps and over validation."""

    def __init__(self) -> None:
        self.train_peak: int | None = None
        self.val_peak: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.synchronize()
        self.train_peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.synchronize()
        self.val_peak = torch.cuda.max_memory_allocated()


def measure(cfg: Any, profile: HardwareProfile, batch_size: int) -> tuple[int, int]:
    """Real peaks (bytes) of two training steps and one validation batch at `batch_size`."""
    run_cfg = copy.deepcopy(cfg)
    sized = profile.model_copy(update={"batch_size": batch_size, "val_batch_size": batch_size})
    with open_dict(run_cfg):
        run_cfg.hw = OmegaConf.create(sized.model_dump())
    datamodule = instantiate(run_cfg.data)
    model = instantiate(run_cfg.model)
    peaks = PhasePeaks()
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        precision=profile.precision,
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[peaks],
        default_root_dir=str(REPO_ROOT / "logs" / NAME),
    )
    trainer.fit(model, datamodule=datamodule)
    if peaks.train_peak is None or peaks.val_peak is None:
        raise RuntimeError(f"batch size {batch_size}: the run did not reach validation")
    del trainer, model, datamodule
    gc.collect()
    torch.cuda.empty_cache()
    return peaks.train_peak, peaks.val_peak


def _row(batch_size: int, phase: str, predicted: int, measured: int, peak_at: str) -> dict:
    error = 100.0 * (predicted - measured) / measured
    return {
        "batch_size": batch_size,
        "phase": phase,
        "predicted_gib": round(predicted / GIB, 4),
        "measured_gib": round(measured / GIB, 4),
        "error_pct": round(error, 2),
        "within_target": abs(error) <= TARGET_ERROR_PCT,
        "predicted_peak_at": peak_at,
    }


def run(batch_sizes: Sequence[int], overrides: Sequence[str]) -> dict[str, Any]:
    """Predict and measure every batch size; the comparison as JSON-ready numbers."""
    cfg = compose_config("train", [*SMALL_DATA, *overrides])
    requested = requested_profile(cfg, conf_dir=CONF_DIR).profile
    profile = requested.model_copy(update={"compile": False})
    rows = []
    for batch_size in batch_sizes:
        plan = plan_task(
            plan_request(cfg, profile, batch_sizes=(batch_size, batch_size), with_remedies=False)
        )
        train_peak, val_peak = measure(cfg, profile, batch_size)
        for phase, measured in (("train", train_peak), ("val", val_peak)):
            predicted = getattr(plan, phase)
            rows.append(
                _row(
                    batch_size,
                    phase,
                    predicted.predicted_max_allocated,
                    measured,
                    predicted.peak_at,
                )
            )
    return {
        "profile": profile.name,
        "precision": profile.precision,
        "model": str(cfg.model.get("_target_")),
        "target_error_pct": TARGET_ERROR_PCT,
        "all_within_target": all(row["within_target"] for row in rows),
        "comparisons": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=list(DEFAULT_BATCH_SIZES),
        help="batch sizes to compare (default: %(default)s)",
    )
    args, overrides = parser.parse_known_args(argv)
    if not torch.cuda.is_available():
        print(
            f"{NAME}: needs a CUDA GPU to compare against (torch.cuda.is_available() is False "
            f"with torch {torch.__version__}); plan without one: python scripts/plan_memory.py "
            "+hw=t4",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    numbers = run(args.batch_sizes, overrides)
    path = write_result(NAME, numbers, started=started)
    for row in numbers["comparisons"]:
        print(
            f"batch {row['batch_size']:>4} {row['phase']:<5} predicted {row['predicted_gib']:.3f} "
            f"GiB, measured {row['measured_gib']:.3f} GiB ({row['error_pct']:+.1f}%)"
        )
    print(f"wrote {path}")
    return 0 if numbers["all_within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
