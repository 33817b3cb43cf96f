"""`debug=smoke` with both fault switches: the run completes and says what it survived."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest

from vramkit.core.run.train import train

CALLBACKS = "callbacks=[default,oom_fault_injection,phase_memory_hygiene,memory_monitor]"


@pytest.mark.slow
def test_smoke_run_survives_injected_training_and_validation_ooms(compose_config, caplog):
    cfg = compose_config(
        "+hw=cpu",
        "debug=smoke",
        "logger=csv",
        CALLBACKS,
        "+fault.oom_train_above=2",
        "+fault.oom_val_above=1",
    )
    with caplog.at_level(logging.WARNING):
        hmean = train(cfg)
    assert hmean is not None
    (metrics_csv,) = Path(cfg.paths.output_dir).glob("csv/version_*/metrics.csv")
    with metrics_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    last = {name: value for row in rows for name, value in row.items() if value}
    # training batches of 4: redone as 2 x 2, same effective batch; validation 4 -> 2 -> 1
    assert float(last["oom/train_recoveries"]) == 1
    assert float(last["oom/train_micro_batch"]) == 2
    assert float(last["oom/train_accumulation"]) == 2
    assert float(last["oom/val_recoveries"]) == 2
    assert float(last["oom/val_micro_batch"]) == 1
    for phase in ("train", "val"):
        assert float(last[f"mem/{phase}_peak_gib"]) > 0
    assert "Out of memory in the train step" in caplog.text
    assert "Out of memory in the val step" in caplog.text
    assert "Fault injection on" in caplog.text
