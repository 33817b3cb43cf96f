"""One tiny ``train()`` run with the throughput, progress-bar and checkpoint-retention configs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from vramkit.core.run.train import train

CALLBACKS = "callbacks=[default,throughput_monitor,progress_bar,checkpoint_retention]"
ATOMIC_WRITES = "+trainer.plugins=[{_target_:vramkit.core.io.checkpoint_io.AtomicCheckpointIO}]"


@pytest.mark.slow
def test_a_smoke_run_logs_perf_metrics_and_reports_its_checkpoints(compose_config):
    cfg = compose_config(
        "+hw=cpu",
        "debug=smoke",
        "logger=csv",
        CALLBACKS,
        ATOMIC_WRITES,
        "callbacks.checkpoint_retention.every_n_epochs=1",
        "callbacks.progress_bar.refresh_rate=0",
    )
    train(cfg)
    run_dir = Path(cfg.paths.output_dir)
    (metrics_csv,) = run_dir.glob("csv/version_*/metrics.csv")
    with metrics_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    logged = {name for row in rows for name, value in row.items() if value}
    assert {
        "perf/train_samples_per_s",
        "perf/val_samples_per_s",
        "perf/train_step_ms_median",
        "perf/train_step_ms_p90",
        "perf/data_wait_fraction",
        "perf/val_train_time_ratio",
    } <= logged
    assert "perf/mfu" not in logged  # the CPU profile has no peak TFLOPS

    report = json.loads((run_dir / "checkpoint_storage.json").read_text())
    roles = {entry["name"]: entry["role"] for entry in report["files"]}
    assert roles == {
        "epoch_000.ckpt": "best",
        "last.ckpt": "last",
        "periodic_epoch_000.ckpt": "periodic",
    }
    periodic = torch.load(run_dir / "checkpoints" / "periodic_epoch_000.ckpt", weights_only=True)
    assert periodic["epoch"] == 0
