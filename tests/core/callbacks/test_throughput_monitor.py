"""ThroughputMonitor: the documented perf/ metrics reach the logger, with values that are right."""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vramkit.core.callbacks import throughput_monitor as tm
from vramkit.core.callbacks.throughput_monitor import (
    ThroughputMonitor,
    _p90,
    peak_tflops_for_precision,
)

PERF_NAMES = {
    "perf/train_samples_per_s",
    "perf/val_samples_per_s",
    "perf/train_step_ms_median",
    "perf/train_step_ms_p90",
    "perf/data_wait_fraction",
    "perf/val_train_time_ratio",
    "perf/mfu",
}
BATCH = 8
IN, HIDDEN, OUT = 16, 32, 4


class _Vectors(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": torch.randn(IN), "name": f"sample_{index}"}


def _collate_after(load_s: float):
    """Text-detection-like batches (a count, a tensor, a list of names), built in ``load_s`` s."""

    def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
        time.sleep(load_s)
        return {
            "skipped": 0,
            "x": torch.stack([s["x"] for s in samples]),
            "names": [s["name"] for s in samples],
        }

    return collate


class _TinyRegressor(L.LightningModule):
    def __init__(self, train_s: float = 0.0, val_s: float = 0.0, load_s: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
        self.train_s, self.val_s, self.load_s = train_s, val_s, load_s

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        time.sleep(self.train_s)
        loss = self.net(batch["x"]).pow(2).mean()
        self.log("train/loss", loss, batch_size=BATCH)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        time.sleep(self.val_s)
        self.log("val/loss", self.net(batch["x"]).pow(2).mean(), batch_size=BATCH)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _loader(self) -> DataLoader:
        return DataLoader(_Vectors(), batch_size=BATCH, collate_fn=_collate_after(self.load_s))

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()


def _fit(tmp_path: Path, monitor: ThroughputMonitor, model: _TinyRegressor, **trainer_kwargs):
    defaults = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        limit_train_batches=6,
        limit_val_batches=2,
        log_every_n_steps=2,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=CSVLogger(tmp_path, name="csv"),
        callbacks=[monitor],
    )
    trainer = L.Trainer(**{**defaults, **trainer_kwargs})
    trainer.fit(model)
    return trainer


def _perf_rows(tmp_path: Path) -> list[dict[str, float]]:
    """Every CSV row's non-empty perf/ values."""
    (metrics_csv,) = tmp_path.glob("csv/version_*/metrics.csv")
    with metrics_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    perf = [{k: float(v) for k, v in row.items() if k.startswith("perf/") and v} for row in rows]
    return [row for row in perf if row]


def _values(rows: list[dict[str, float]], name: str) -> list[float]:
    return [row[name] for row in rows if name in row]


def test_perf_metrics_reach_the_csv_logger_under_the_documented_names(tmp_path):
    monitor = ThroughputMonitor(peak_tflops=1e-3)
    _fit(tmp_path, monitor, _TinyRegressor())
    rows = _perf_rows(tmp_path)
    assert {name for row in rows for name in row} == PERF_NAMES
    assert all(v > 0 for v in _values(rows, "perf/train_samples_per_s"))
    assert all(0.0 <= v <= 1.0 for v in _values(rows, "perf/data_wait_fraction"))
    for row in rows:
        if "perf/train_step_ms_median" in row:
            assert 0 < row["perf/train_step_ms_median"] <= row["perf/train_step_ms_p90"]
    # one validation row per epoch
    assert len(_values(rows, "perf/val_samples_per_s")) == 2
    # 12 steps, the first one (FLOP counting) left out
    assert monitor.measured_steps == 11


def test_flops_of_one_batch_and_mfu_are_counted_exactly(tmp_path):
    peak_tflops = 1e-3
    monitor = ThroughputMonitor(peak_tflops=peak_tflops)
    _fit(tmp_path, monitor, _TinyRegressor())
    forward = 2 * BATCH * (IN * HIDDEN + HIDDEN * OUT)
    # the first layer's input needs no gradient: only its weight gradient is computed
    backward = 2 * BATCH * IN * HIDDEN + 2 * 2 * BATCH * HIDDEN * OUT
    assert monitor.flops_per_batch == forward + backward
    for row in _perf_rows(tmp_path):
        if "perf/mfu" in row:
            batches_per_s = row["perf/train_samples_per_s"] / BATCH
            expected = monitor.flops_per_batch * batches_per_s / (peak_tflops * 1e12)
            assert row["perf/mfu"] == pytest.approx(expected, rel=1e-6)


def test_step_time_data_wait_and_validation_ratio_measure_what_happened(tmp_path, monkeypatch):
    # 20 ms to build each batch, 10 ms per training step, 40 ms per validation step, on a clock
    # that only those sleeps move: the measures must come out as the ideal ones, however loaded
    # the machine that runs the test is.
    load_s, train_s, val_s = 0.020, 0.010, 0.040
    now = [1000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(tm.WallClock, "mark", staticmethod(lambda: now[0]))
    monitor = ThroughputMonitor()
    _fit(tmp_path, monitor, _TinyRegressor(train_s=train_s, val_s=val_s, load_s=load_s))
    summary = monitor.summary
    assert summary["perf/train_step_ms_median"] == pytest.approx(30.0)
    assert summary["perf/data_wait_fraction"] == pytest.approx(20 / 30)
    assert summary["perf/train_samples_per_s"] == pytest.approx(BATCH / 0.030)
    assert summary["perf/val_train_time_ratio"] == pytest.approx(60 / 30)
    assert summary["perf/val_samples_per_s"] == pytest.approx(BATCH / (load_s + val_s))


def test_without_a_peak_mfu_is_not_reported_and_the_run_says_so_once(tmp_path, caplog):
    # the CPU profile's peaks are all null
    monitor = ThroughputMonitor(peak_tflops_fp16=None, peak_tflops_bf16=None, peak_tflops_fp32=None)
    with caplog.at_level(logging.INFO, logger=tm.__name__):
        _fit(tmp_path, monitor, _TinyRegressor())
    rows = _perf_rows(tmp_path)
    assert not _values(rows, "perf/mfu")
    assert _values(rows, "perf/train_samples_per_s")
    assert monitor.flops_per_batch is None  # nothing counted when nothing would use it
    notes = [r for r in caplog.records if "perf/mfu is not reported" in r.getMessage()]
    assert len(notes) == 1 and "32-true" in notes[0].getMessage()


def test_the_peak_follows_the_precision():
    peaks = {"fp16": 65.0, "bf16": None, "fp32": 8.1}
    assert peak_tflops_for_precision("16-mixed", peaks) == 65.0
    assert peak_tflops_for_precision("bf16-mixed", peaks) is None
    assert peak_tflops_for_precision("32-true", peaks) == 8.1
    assert peak_tflops_for_precision("64-true", peaks) is None


class _LaggingDevice:
    """Marks that complete ``lag`` marks late, like CUDA events behind a busy stream.

    Reading an incomplete mark waits for the device, which completes every mark made so far
    (``torch.cuda.Event.synchronize`` on the newest event); such waits are counted.
    """

    def __init__(self, lag: int) -> None:
        self.lag, self.made, self.completed_upto, self.waits = lag, 0, 0, 0

    def mark(self) -> tuple[int, float]:
        self.made += 1
        return self.made, time.perf_counter()

    def ready(self, mark: tuple[int, float]) -> bool:
        return mark[0] <= max(self.completed_upto, self.made - self.lag)

    def seconds(self, start: tuple[int, float], end: tuple[int, float]) -> float:
        if not self.ready(end):
            self.waits += 1
            self.completed_upto = self.made
        return end[1] - start[1]


def test_marks_are_read_without_waiting_on_every_step(tmp_path, monkeypatch):
    device = _LaggingDevice(lag=5)
    monkeypatch.setattr(tm, "step_clock_for", lambda _: device)
    monitor = ThroughputMonitor()
    _fit(tmp_path, monitor, _TinyRegressor(), log_every_n_steps=1)
    # at most one wait per epoch end and per validation (2 epochs), none per step
    assert device.waits <= 4
    assert monitor.measured_steps == 11  # every step is counted in the end
    assert len(_values(_perf_rows(tmp_path), "perf/train_samples_per_s")) >= 6


@pytest.mark.parametrize(
    ("key", "value"), [("peak_tflops", 0.0), ("warmup_steps", 0), ("summary_window", 0)]
)
def test_bad_arguments_are_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        ThroughputMonitor(**{key: value})


def test_a_compiled_model_is_not_run_under_the_flop_counter(tmp_path, caplog):
    model = _TinyRegressor()
    model.net.compile(backend="eager")  # FlopCounterMode would leave it slow for the whole run
    monitor = ThroughputMonitor(peak_tflops=1e-3)
    with caplog.at_level(logging.INFO, logger=tm.__name__):
        _fit(tmp_path, monitor, model, max_epochs=1)
    assert monitor.flops_per_batch is None
    assert not _values(_perf_rows(tmp_path), "perf/mfu")
    assert any("compiled model" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("count", [1, 2, 3, 10, 17])
def test_the_p90_is_numpys_linear_percentile(count):
    values = [float(v) for v in torch.rand(count, generator=torch.Generator().manual_seed(count))]
    assert _p90(values) == pytest.approx(float(np.percentile(values, 90)), rel=1e-12)
